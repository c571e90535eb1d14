//! Export backend for NetApp ONTAP (9.6+) over its REST API.
//!
//! Written from NetApp's published REST API reference; **untested against a real ONTAP
//! system** (none is available here). `tests/it/nfs_ontap.rs` runs it against a small fake
//! ONTAP on 127.0.0.1 that records every request.
//!
//! Mapping:
//! - An export is an ONTAP volume whose junction path (`nas.path`) is the export name;
//!   the volume must already exist (ONTAP volumes are storage, not created here). The
//!   `fs_path` argument has no meaning on ONTAP and is ignored.
//! - Each export gets its own export policy `<policy_prefix><export>` in the configured
//!   SVM (`POST /api/protocols/nfs/export-policies`), assigned to the volume with
//!   `PATCH /api/storage/volumes/{uuid}` (`nas.export_policy.name`). ONTAP denies every
//!   client of a policy without rules, which is the state after `ensure_export`.
//! - `set_rules` diffs against `GET .../export-policies/{id}/rules` by rule index:
//!   stale rules are deleted first (revocation before grant), missing ones created with
//!   `POST .../rules`. Access maps to `ro_rule`/`rw_rule` (`sys` or `never`), superuser
//!   to `superuser` (`sys` or `none`), protocols to `nfs3`/`nfs4` (empty = `any`).
//! - `remove_export` deletes the policy's rules (access ends at once) and leaves the
//!   empty policy assigned, since a policy in use cannot be deleted and falling back to
//!   the SVM's `default` policy could grant access.
//!
//! Transport: plain HTTP through `ureq`; this build carries no TLS client, so an
//! `https://` URL is refused at config time with a hint (put a TLS-terminating proxy,
//! e.g. stunnel, on the appliance in front of the cluster management LIF).

use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::rules::{RuleDiff, RuleTarget};
use super::{validate_export_name, Access, ExportBackend, ExportRule, Health, NfsError, Protocol};

/// `[nfs.ontap]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OntapConfig {
    /// Cluster management URL, e.g. `http://127.0.0.1:8443` (see the module doc on TLS).
    pub url: String,
    pub username: String,
    pub password: Option<String>,
    /// File holding the password (first line), instead of `password`.
    pub password_file: Option<std::path::PathBuf>,
    /// SVM (vserver) that owns the volumes and policies.
    pub svm: String,
    pub policy_prefix: String,
    pub timeout_ms: u64,
}

impl Default for OntapConfig {
    fn default() -> Self {
        OntapConfig {
            url: String::new(),
            username: "admin".into(),
            password: None,
            password_file: None,
            svm: String::new(),
            policy_prefix: "bootplane".into(),
            timeout_ms: 15_000,
        }
    }
}

impl OntapConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.url.starts_with("https://") {
            anyhow::bail!("nfs.ontap.url {:?}: this build has no TLS client; point it at a local TLS-terminating proxy (http://127.0.0.1:PORT) in front of the cluster", self.url);
        }
        if !self.url.starts_with("http://") {
            anyhow::bail!("nfs.ontap.url must start with http:// (got {:?})", self.url);
        }
        if self.svm.is_empty() {
            anyhow::bail!("nfs.ontap.svm is required");
        }
        if self.password.is_none() && self.password_file.is_none() {
            anyhow::bail!("nfs.ontap needs password or password_file");
        }
        Ok(())
    }
}

/// The ONTAP backend (see the module doc).
pub struct Ontap {
    client: Client,
}

#[derive(Clone)]
struct Client {
    agent: ureq::Agent,
    base: String,
    auth: String,
    svm: String,
    prefix: String,
}

impl Ontap {
    pub fn new(cfg: OntapConfig) -> anyhow::Result<Ontap> {
        use anyhow::Context as _;
        cfg.validate()?;
        let password = match (&cfg.password, &cfg.password_file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("reading {}", f.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
            (None, None) => unreachable!("validated"),
        };
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", cfg.username, password))
        );
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_millis(cfg.timeout_ms))
            .redirects(0)
            .build();
        Ok(Ontap {
            client: Client {
                agent,
                base: cfg.url.trim_end_matches('/').to_string(),
                auth,
                svm: cfg.svm,
                prefix: cfg.policy_prefix,
            },
        })
    }

    /// The export policy name used for `export`.
    pub fn policy_name(&self, export: &str) -> String {
        self.client.policy_name(export)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> Result<T, NfsError> + Send + 'static,
    ) -> Result<T, NfsError> {
        let c = self.client.clone();
        tokio::task::spawn_blocking(move || f(&c))
            .await
            .map_err(|e| NfsError::Backend(format!("ontap worker: {e}")))?
    }
}

/// Everything but RFC 3986 unreserved characters is escaped.
const ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn enc(s: &str) -> String {
    utf8_percent_encode(s, ESCAPE).to_string()
}

impl Client {
    fn policy_name(&self, export: &str) -> String {
        let body: String = export
            .trim_matches('/')
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{}_{}", self.prefix, body)
    }

    /// One request; `Ok(None)` for 404.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Option<Value>, NfsError> {
        let url = format!("{}{}", self.base, path);
        let req = self
            .agent
            .request(method, &url)
            .set("Authorization", &self.auth)
            .set("Accept", "application/json");
        let res = match body {
            Some(b) => req
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        match res {
            Ok(r) => {
                let text = r.into_string().map_err(|e| {
                    NfsError::Backend(format!("ontap {method} {path}: reading response: {e}"))
                })?;
                if text.trim().is_empty() {
                    return Ok(Some(Value::Null));
                }
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| NfsError::Backend(format!("ontap {method} {path}: bad json: {e}")))
            }
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let msg = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| {
                        v.pointer("/error/message")
                            .and_then(|m| m.as_str())
                            .map(String::from)
                    })
                    .unwrap_or(text);
                Err(NfsError::Backend(format!(
                    "ontap {method} {path}: http {code}: {}",
                    msg.trim()
                )))
            }
            Err(e) => Err(NfsError::Down(format!("ontap {method} {url}: {e}"))),
        }
    }

    fn policy_id(&self, name: &str) -> Result<Option<u64>, NfsError> {
        let v = self
            .call(
                "GET",
                &format!(
                    "/api/protocols/nfs/export-policies?name={}&svm.name={}&fields=id",
                    enc(name),
                    enc(&self.svm)
                ),
                None,
            )?
            .unwrap_or(Value::Null);
        Ok(v.pointer("/records/0/id").and_then(Value::as_u64))
    }

    fn ensure_export(&self, export: &str) -> Result<(), NfsError> {
        let name = self.policy_name(export);
        if self.policy_id(&name)?.is_none() {
            self.call(
                "POST",
                "/api/protocols/nfs/export-policies",
                Some(&json!({"name": name, "svm": {"name": self.svm}})),
            )?;
            if self.policy_id(&name)?.is_none() {
                return Err(NfsError::Backend(format!(
                    "ontap: export policy {name} not found after creating it"
                )));
            }
        }
        let vols = self
            .call("GET", &format!("/api/storage/volumes?svm.name={}&nas.path={}&fields=uuid,name,nas.export_policy.name", enc(&self.svm), enc(export)), None)?
            .unwrap_or(Value::Null);
        let Some(vol) = vols.pointer("/records/0") else {
            return Err(NfsError::InvalidExport(
                export.into(),
                format!(
                    "no ONTAP volume in svm {} has junction path {export}",
                    self.svm
                ),
            ));
        };
        let uuid = vol
            .get("uuid")
            .and_then(Value::as_str)
            .ok_or_else(|| NfsError::Backend("ontap: volume record without uuid".into()))?;
        if vol
            .pointer("/nas/export_policy/name")
            .and_then(Value::as_str)
            != Some(name.as_str())
        {
            self.call(
                "PATCH",
                &format!("/api/storage/volumes/{}", enc(uuid)),
                Some(&json!({"nas": {"export_policy": {"name": name}}})),
            )?;
        }
        Ok(())
    }

    /// The path of the rules of `export`'s policy (`.../export-policies/{id}/rules`).
    fn rules_path(&self, export: &str) -> Result<String, NfsError> {
        let name = self.policy_name(export);
        let id = self
            .policy_id(&name)?
            .ok_or_else(|| NfsError::UnknownExport(export.into()))?;
        Ok(format!("/api/protocols/nfs/export-policies/{id}/rules"))
    }

    /// The rule records of the policy at `base` (those with an index).
    fn rules_in_force(&self, base: &str) -> Result<Vec<Value>, NfsError> {
        let existing = self
            .call(
                "GET",
                &format!("{base}?fields=index,clients,ro_rule,rw_rule,superuser,protocols"),
                None,
            )?
            .unwrap_or(Value::Null);
        let existing: Vec<Value> = existing
            .get("records")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok(existing
            .into_iter()
            .filter(|e| e.get("index").and_then(Value::as_u64).is_some())
            .collect())
    }

    /// Deletes the rules at indexes `stale`, then creates the rule bodies `missing`.
    fn change_rules(&self, base: &str, stale: &[u64], missing: &[Value]) -> Result<(), NfsError> {
        for idx in stale {
            self.call("DELETE", &format!("{base}/{idx}"), None)?;
        }
        for d in missing {
            self.call("POST", base, Some(d))?;
        }
        Ok(())
    }

    fn remove_export(&self, export: &str) -> Result<(), NfsError> {
        let name = self.policy_name(export);
        let Some(id) = self.policy_id(&name)? else {
            return Ok(());
        };
        let base = format!("/api/protocols/nfs/export-policies/{id}/rules");
        let existing = self
            .call("GET", &format!("{base}?fields=index"), None)?
            .unwrap_or(Value::Null);
        for e in existing
            .get("records")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            if let Some(idx) = e.get("index").and_then(Value::as_u64) {
                self.call("DELETE", &format!("{base}/{idx}"), None)?;
            }
        }
        Ok(())
    }

    fn health(&self) -> Result<Health, NfsError> {
        let v = self
            .call("GET", "/api/cluster?fields=version,name", None)?
            .unwrap_or(Value::Null);
        let version = v
            .pointer("/version/full")
            .and_then(Value::as_str)
            .unwrap_or("unknown version");
        Ok(Health {
            backend: "ontap",
            detail: format!(
                "{} ({version})",
                v.get("name").and_then(Value::as_str).unwrap_or("cluster")
            ),
        })
    }
}

/// The ONTAP `export_rule` body for one rule.
pub(crate) fn rule_json(r: &ExportRule) -> Value {
    let ro = if r.access == Access::None {
        "never"
    } else {
        "sys"
    };
    let rw = if r.access == Access::Rw {
        "sys"
    } else {
        "never"
    };
    let su = if r.superuser && r.access != Access::None {
        "sys"
    } else {
        "none"
    };
    let protocols: Vec<&str> = if r.protocols.is_empty() {
        vec!["any"]
    } else {
        r.protocols
            .iter()
            .map(|p| match p {
                Protocol::Nfs3 => "nfs3",
                Protocol::Nfs4 => "nfs4",
            })
            .collect()
    };
    json!({
        "index": r.index,
        "clients": [{"match": r.client.to_string()}],
        "ro_rule": [ro],
        "rw_rule": [rw],
        "superuser": [su],
        "protocols": protocols,
    })
}

/// Whether an existing ONTAP rule record equals a desired rule body (order-insensitive
/// arrays, only the fields bootplane sets).
fn same_rule(desired: &Value, existing: &Value) -> bool {
    fn set(v: Option<&Value>, key: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = v
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| match key {
                        Some(k) => x.get(k).and_then(Value::as_str).map(String::from),
                        None => x.as_str().map(String::from),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
    desired.get("index") == existing.get("index")
        && set(desired.get("clients"), Some("match")) == set(existing.get("clients"), Some("match"))
        && ["ro_rule", "rw_rule", "superuser", "protocols"]
            .iter()
            .all(|k| set(desired.get(*k), None) == set(existing.get(*k), None))
}

/// An export's policy rules (`.../export-policies/{id}/rules`).
pub(super) struct PolicyRules<'a> {
    ontap: &'a Ontap,
    base: String,
}

impl Ontap {
    async fn open<'a>(&'a self, export: &'a str) -> Result<PolicyRules<'a>, NfsError> {
        let export = export.to_string();
        let base = self.blocking(move |c| c.rules_path(&export)).await?;
        Ok(PolicyRules { ontap: self, base })
    }
}

/// ONTAP is the record: the rules in force are read back from the export policy, and a
/// change deletes the stale rules before it creates the missing ones.
impl RuleTarget for PolicyRules<'_> {
    /// An ONTAP rule record.
    type Applied = Value;

    async fn in_force(&mut self) -> Result<Vec<Value>, NfsError> {
        let base = self.base.clone();
        self.ontap.blocking(move |c| c.rules_in_force(&base)).await
    }

    fn same(desired: &ExportRule, applied: &Value) -> bool {
        same_rule(&rule_json(desired), applied)
    }

    async fn unchanged(&mut self, _rules: &[ExportRule]) -> Result<(), NfsError> {
        Ok(())
    }

    async fn change(
        &mut self,
        _rules: &[ExportRule],
        diff: &RuleDiff<'_, Value>,
    ) -> Result<(), NfsError> {
        let base = self.base.clone();
        let stale: Vec<u64> = diff
            .stale
            .iter()
            .filter_map(|e| e.get("index").and_then(Value::as_u64))
            .collect();
        let missing: Vec<Value> = diff.missing.iter().map(|r| rule_json(r)).collect();
        self.ontap
            .blocking(move |c| c.change_rules(&base, &stale, &missing))
            .await
    }
}

impl ExportBackend for Ontap {
    fn name(&self) -> &'static str {
        "ontap"
    }

    fn ensure_export<'a>(
        &'a self,
        export: &'a str,
        _fs_path: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        async move {
            validate_export_name(export)?;
            let export = export.to_string();
            self.blocking(move |c| c.ensure_export(&export)).await
        }
        .boxed()
    }

    fn set_rules<'a>(
        &'a self,
        export: &'a str,
        rules: Vec<ExportRule>,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        super::rules::set_rules(rules, self.open(export)).boxed()
    }

    fn remove_export<'a>(&'a self, export: &'a str) -> BoxFuture<'a, Result<(), NfsError>> {
        let export = export.to_string();
        async move { self.blocking(move |c| c.remove_export(&export)).await }.boxed()
    }

    fn health(&self) -> BoxFuture<'_, Result<Health, NfsError>> {
        async move { self.blocking(|c| c.health()).await }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_bodies() {
        let r = ExportRule {
            index: 3,
            client: "10.0.0.0/24".parse().unwrap(),
            access: Access::Rw,
            protocols: vec![Protocol::Nfs3],
            superuser: true,
        };
        assert_eq!(
            rule_json(&r),
            json!({"index":3,"clients":[{"match":"10.0.0.0/24"}],"ro_rule":["sys"],"rw_rule":["sys"],"superuser":["sys"],"protocols":["nfs3"]})
        );
        let r = ExportRule::read_only(1, "10.0.0.9".parse().unwrap());
        let j = rule_json(&r);
        assert_eq!(j["rw_rule"], json!(["never"]));
        assert_eq!(j["superuser"], json!(["none"]));
        assert_eq!(j["protocols"], json!(["any"]));
        let mut existing = j.clone();
        existing["_links"] = json!({});
        existing["protocols"] = json!(["any"]);
        assert!(same_rule(&j, &existing));
        existing["ro_rule"] = json!(["krb5"]);
        assert!(!same_rule(&j, &existing));
    }

    #[test]
    fn config_validation() {
        let mut c = OntapConfig {
            url: "https://cluster".into(),
            svm: "svm1".into(),
            password: Some("x".into()),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("TLS"));
        c.url = "http://127.0.0.1:1".into();
        c.validate().unwrap();
        c.svm.clear();
        assert!(c.validate().is_err());
    }
}
