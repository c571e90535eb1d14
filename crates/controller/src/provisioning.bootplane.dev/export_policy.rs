//! The ExportPolicy reconciler: pushes a policy's rules (the `ExportPolicyRule`s naming
//! it, sorted by index, ties by name) to the export backend with `set_rules`, and
//! records the outcome in the policy's status (`appliedRules`: the names in force) and
//! each rule's. Every push holds the controller's push lock, so a slower reconcile can
//! never re-apply a rule set that a later deletion has already replaced. At start-up
//! every policy is pushed before the backend's supervisor runs
//! ([`Provisioning::converge_exports`]).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{merge, read, status_of, to_json, NameRef, Provisioning, SpecRefs};
use crate::model::meta;
use crate::model::views::{string_enum, ObjectMeta};
use crate::nfs::{Access, ClientMatch, ExportRule, NfsError, Protocol};
use crate::store::StoreError;
use crate::{set_condition, Key, Next};

string_enum! {
    /// `ExportPolicy.status.state` and `ExportPolicyRule.status.state`.
    ApplyState { Pending, Applied, Error }
}

/// The fields of an `ExportPolicy` the flow reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ExportPolicy {
    pub metadata: ObjectMeta,
    pub spec: ExportPolicySpec,
    pub status: ExportPolicyStatus,
}

/// `ExportPolicy.spec`, as the Image reconciler writes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ExportPolicySpec {
    pub export_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_volume_ref: Option<NameRef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ExportPolicyStatus {
    /// Names of the rules in force on the backend.
    pub applied_rules: Vec<String>,
    pub message: String,
}

/// The `ExportPolicy.status` fields a push sets (and the condition `Applied`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExportPolicyStatusPatch {
    state: ApplyState,
    message: String,
    applied_rules: Vec<String>,
}

/// An `ExportPolicyRule`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ExportPolicyRule {
    pub metadata: ObjectMeta,
    pub spec: ExportPolicyRuleSpec,
}

/// `ExportPolicyRule.spec` (the server controller writes one per provisioning job).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ExportPolicyRuleSpec {
    pub export_policy_ref: NameRef,
    pub index: u64,
    /// An address or a CIDR ([`ClientMatch`]).
    pub client: String,
    pub access: Access,
    pub protocols: Vec<Protocol>,
    pub superuser: bool,
}

/// `ExportPolicyRule.status`, written whole.
#[derive(Debug, Serialize)]
struct ExportPolicyRuleStatus {
    state: ApplyState,
    message: String,
}

/// `(rule object name, backend rule)` in evaluation order, and `(name, why)` for the
/// rules that were skipped.
pub type NamedRules = (Vec<(String, ExportRule)>, Vec<(String, String)>);

/// Backend rules from ExportPolicyRule objects: sorted by (index, name) and renumbered
/// 1.. so equal indexes cannot collide; rules whose client does not parse are returned
/// separately (they grant nothing).
pub fn backend_rules(objs: &[Arc<Value>]) -> NamedRules {
    let mut bad = Vec::new();
    let mut sorted: Vec<ExportPolicyRule> = Vec::new();
    for o in objs {
        match crate::model::views::view::<ExportPolicyRule>(o) {
            Ok(r) => sorted.push(r),
            Err(e) => bad.push((meta::name(o).to_string(), e.to_string())),
        }
    }
    sorted.sort_by(|a, b| (a.spec.index, &a.metadata.name).cmp(&(b.spec.index, &b.metadata.name)));
    let mut ok = Vec::new();
    for r in sorted {
        let client = match r.spec.client.parse::<ClientMatch>() {
            Ok(c) => c,
            Err(e) => {
                bad.push((r.metadata.name, e.to_string()));
                continue;
            }
        };
        let rule = ExportRule {
            index: ok.len() as u32 + 1,
            client,
            access: r.spec.access,
            protocols: r.spec.protocols,
            superuser: r.spec.superuser,
        };
        ok.push((r.metadata.name, rule));
    }
    (ok, bad)
}

impl Provisioning {
    /// Push every ExportPolicy in the store to the backend (start-up convergence).
    pub(crate) async fn converge_exports(&self) {
        let (policies, _) = self.store.list(&self.t_policy, None, None);
        for p in policies {
            let key = (super::ns_of(&p), meta::name(&p).to_string());
            if let Err(e) = self.sync_policy(&key).await {
                tracing::warn!(policy = %format!("{}/{}", key.0, key.1), error = %e, "pushing export policy at start-up");
            }
        }
    }

    pub(super) async fn reconcile_policy(&self, key: &Key) -> Result<Next, StoreError> {
        if !self.settings.nfs_enabled {
            return Ok(Next::Done);
        }
        self.sync_policy(key).await
    }

    /// Push the policy's rules to the backend and record them in its status.
    pub(super) async fn sync_policy(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let _g = self.push.lock().await;
        let Some(p) = self.get(&self.t_policy, ns, name)? else {
            return Ok(Next::Done);
        };
        let policy: ExportPolicy = read(&self.t_policy, &p)?;
        if policy.metadata.is_deleting() {
            return Ok(Next::Done);
        }
        let export = policy.spec.export_path;
        let (all, _) = self.store.list(&self.t_rule, Some(ns), None);
        let mine: Vec<Arc<Value>> = all
            .into_iter()
            .filter(|r| {
                SpecRefs::of(r).export_policy_ref.map(|p| p.name).as_ref() == Some(name)
                    && !meta::is_deleting(r)
            })
            .collect();
        let (rules, bad) = backend_rules(&mine);
        let names: Vec<String> = rules.iter().map(|(n, _)| n.clone()).collect();
        let res = self
            .backend
            .set_rules(&export, rules.into_iter().map(|(_, r)| r).collect())
            .await;
        let mut st = status_of(&p);
        let next = match &res {
            Ok(()) => {
                let patch = ExportPolicyStatusPatch {
                    state: ApplyState::Applied,
                    message: format!(
                        "{} rule(s) in force on {}",
                        names.len(),
                        self.backend.name()
                    ),
                    applied_rules: names,
                };
                merge(&mut st, &patch);
                set_condition(
                    &mut st,
                    "Applied",
                    true,
                    "Applied",
                    "rules are in force on the export backend",
                );
                Next::Done
            }
            Err(e) => {
                let reason = match e {
                    NfsError::Down(_) => "ServerDown",
                    NfsError::PortInUse(_) => "PortInUse",
                    NfsError::UnknownExport(_) => "NotExported",
                    _ => "BackendError",
                };
                // What is in force is unknown: nothing is claimed as applied.
                let patch = ExportPolicyStatusPatch {
                    state: ApplyState::Error,
                    message: format!("pushing rules to {}: {e}", self.backend.name()),
                    applied_rules: Vec::new(),
                };
                merge(&mut st, &patch);
                set_condition(&mut st, "Applied", false, reason, &e.to_string());
                Next::After(Duration::from_secs(2))
            }
        };
        match self.set_status(&self.t_policy, &p, st).await {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(StoreError::Conflict { .. }) => return Ok(Next::After(Duration::from_millis(20))),
            Err(e) => return Err(e),
        }
        for r in &mine {
            let (state, message) = match (&res, bad.iter().find(|(n, _)| n == meta::name(r))) {
                (_, Some((_, why))) => (ApplyState::Error, why.clone()),
                (Ok(()), None) => (ApplyState::Applied, format!("in force on {export}")),
                (Err(e), None) => (ApplyState::Pending, e.to_string()),
            };
            let st = to_json(&ExportPolicyRuleStatus { state, message });
            match self.set_status(&self.t_rule, r, st).await {
                Ok(()) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_sorted_by_index_then_name_and_renumbered() {
        let r = |n: &str, i: u64, c: &str| {
            Arc::new(
                json!({"metadata": {"name": n}, "spec": {"index": i, "client": c, "access": "ro"}}),
            )
        };
        let (ok, bad) = backend_rules(&[
            r("b", 100, "10.0.0.2"),
            r("a", 100, "10.0.0.1"),
            r("deny", 1, "10.0.0.0/24"),
            r("broken", 5, "not-an-ip"),
        ]);
        let names: Vec<&str> = ok.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["deny", "a", "b"]);
        assert_eq!(
            ok.iter().map(|(_, r)| r.index).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, "broken");
    }

    /// A rule's access, protocols and superuser reach the backend rule; absent ones
    /// read as before (access `ro`, no protocols, no superuser).
    #[test]
    fn rule_fields_and_defaults() {
        let (ok, _) = backend_rules(&[
            Arc::new(
                json!({"metadata": {"name": "w"}, "spec": {"index": 1, "client": "10.0.0.1",
                "access": "rw", "protocols": ["nfs4"], "superuser": true}}),
            ),
            Arc::new(
                json!({"metadata": {"name": "x"}, "spec": {"index": 2, "client": "10.0.0.2"}}),
            ),
        ]);
        let (w, x) = (&ok[0].1, &ok[1].1);
        assert_eq!(
            (w.access, w.protocols.clone(), w.superuser),
            (Access::Rw, vec![Protocol::Nfs4], true)
        );
        assert_eq!(
            (x.access, x.protocols.clone(), x.superuser),
            (Access::Ro, vec![], false)
        );
    }

    #[test]
    fn written_json_is_unchanged() {
        let spec = ExportPolicyRuleSpec {
            export_policy_ref: NameRef::new("demo"),
            index: 100,
            client: "10.0.0.9".into(),
            access: Access::Ro,
            protocols: vec![],
            superuser: false,
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"exportPolicyRef":{"name":"demo"},"index":100,"client":"10.0.0.9","access":"ro","protocols":[],"superuser":false}"#
        );
        let ep = ExportPolicySpec {
            export_path: "/images/default/demo".into(),
            storage_volume_ref: Some(NameRef::new("demo")),
        };
        assert_eq!(
            serde_json::to_string(&ep).unwrap(),
            r#"{"exportPath":"/images/default/demo","storageVolumeRef":{"name":"demo"}}"#
        );
        let st = ExportPolicyRuleStatus {
            state: ApplyState::Pending,
            message: "m".into(),
        };
        assert_eq!(
            serde_json::to_string(&st).unwrap(),
            r#"{"state":"Pending","message":"m"}"#
        );
    }
}
