//! Per-machine Ignition rendering: an operator template (Butane or Ignition JSON, from
//! `ignition/`) is filled with the machine's facts by minijinja, translated, and the
//! claim's ignition secret is merged on top. Results are cached per
//! (server, secret resourceVersion, template revision).
//!
//! Merge order (later wins, Ignition merge rules, see [`super::merge`]):
//! 1. the rendered template (if the boot configuration names one),
//! 2. the claim's ignition secret (`ignition` key; `format: fcos` = Butane, absent =
//!    Ignition JSON, as boot-operator does). Secrets are not templated: they are
//!    user data and may legitimately contain `{{`.
//!
//! Template variables are documented in `ignition/README.md`: `name`, `uuid`,
//! `hostname` (falls back to `name`), `macs`, `mac` (first MAC), `ips`, `ip`
//! (first IP), `labels` (map), `claim.name`, `claim.namespace`, plus the filter
//! `tojson`. Undefined variables are errors (strict mode), so a typo never renders an
//! empty string into a machine's config.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{butane, merge, validate, Error, FilesDir, IgnVersion};

/// What the renderer knows about one machine (the lead maps Server/ServerClaim onto it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct MachineFacts {
    /// Server object name.
    pub name: String,
    /// SMBIOS system UUID.
    pub uuid: Option<String>,
    /// Hostname to give the machine; templates fall back to `name`.
    pub hostname: Option<String>,
    /// MAC addresses, boot NIC first (lowercase, colon separated).
    pub macs: Vec<String>,
    /// IP addresses, boot IP first.
    pub ips: Vec<String>,
    /// Server labels.
    pub labels: BTreeMap<String, String>,
    /// The ServerClaim bound to this server.
    pub claim_name: Option<String>,
    pub claim_namespace: Option<String>,
}

#[derive(Serialize)]
struct Ctx<'a> {
    name: &'a str,
    uuid: &'a str,
    hostname: &'a str,
    macs: &'a [String],
    mac: &'a str,
    ips: &'a [String],
    ip: &'a str,
    labels: &'a BTreeMap<String, String>,
    claim: ClaimCtx<'a>,
}

#[derive(Serialize)]
struct ClaimCtx<'a> {
    name: &'a str,
    namespace: &'a str,
}

impl MachineFacts {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            name: &self.name,
            uuid: self.uuid.as_deref().unwrap_or(""),
            hostname: self
                .hostname
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or(&self.name),
            macs: &self.macs,
            mac: self.macs.first().map(String::as_str).unwrap_or(""),
            ips: &self.ips,
            ip: self.ips.first().map(String::as_str).unwrap_or(""),
            labels: &self.labels,
            claim: ClaimCtx {
                name: self.claim_name.as_deref().unwrap_or(""),
                namespace: self.claim_namespace.as_deref().unwrap_or(""),
            },
        }
    }
}

/// The language a template or secret is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Butane,
    Ignition,
}

/// An operator template.
#[derive(Debug, Clone)]
pub struct Template {
    pub name: String,
    pub format: Format,
    pub source: String,
    /// Content hash; part of the cache key, so editing a template re-renders.
    pub revision: String,
}

impl Template {
    /// A template named `name`; `.bu`, `.yaml`, `.yml` are Butane, anything else JSON.
    pub fn new(name: &str, source: impl Into<String>) -> Template {
        let source = source.into();
        let format = if [".bu", ".yaml", ".yml"].iter().any(|e| name.ends_with(e)) {
            Format::Butane
        } else {
            Format::Ignition
        };
        let revision = hex::encode(&Sha256::digest(source.as_bytes())[..8]);
        Template {
            name: name.to_string(),
            format,
            source,
            revision,
        }
    }
}

/// The claim's ignition secret, decoded (`data.ignition`, optional `data.format`).
#[derive(Debug, Clone)]
pub struct IgnitionSecret {
    pub ignition: String,
    pub format: Option<String>,
}

impl IgnitionSecret {
    /// From a Secret's decoded `data` map.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<IgnitionSecret, Error> {
        let ign = data
            .get("ignition")
            .ok_or_else(|| Error::Secret("missing key \"ignition\"".into()))?;
        let ignition = String::from_utf8(ign.clone())
            .map_err(|_| Error::Secret("key \"ignition\" is not utf-8".into()))?;
        let format = match data.get("format") {
            Some(f) => Some(
                String::from_utf8(f.clone())
                    .map_err(|_| Error::Secret("key \"format\" is not utf-8".into()))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(IgnitionSecret { ignition, format })
    }

    /// From a Kubernetes Secret manifest (YAML or JSON; `data` base64, or `stringData`).
    pub fn from_manifest(src: &str) -> Result<IgnitionSecret, Error> {
        #[derive(Deserialize)]
        struct Manifest {
            #[serde(default)]
            data: BTreeMap<String, String>,
            #[serde(default, rename = "stringData")]
            string_data: BTreeMap<String, String>,
        }
        use base64::Engine;
        let m: Manifest = serde_norway::from_str(src)
            .map_err(|e| Error::Secret(format!("invalid manifest: {e}")))?;
        let mut data = BTreeMap::new();
        for (k, v) in m.data {
            let clean: String = v.chars().filter(|c| !c.is_whitespace()).collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(clean)
                .map_err(|e| Error::Secret(format!("data.{k}: invalid base64: {e}")))?;
            data.insert(k, bytes);
        }
        for (k, v) in m.string_data {
            data.insert(k, v.into_bytes());
        }
        IgnitionSecret::from_data(&data)
    }

    /// Translates/validates the secret on its own.
    pub fn to_config(&self, files: &FilesDir) -> Result<Value, Error> {
        match self.format.as_deref().unwrap_or("") {
            "fcos" | "butane" => Ok(butane::translate_with(&self.ignition, files)?.config),
            "" | "ignition" => {
                let v = validate::parse_json(&self.ignition)?;
                validate::validate(&v)?;
                Ok(v)
            }
            other => Err(Error::Secret(format!(
                "unknown format {other:?} (supported: fcos, or absent for ignition json)"
            ))),
        }
    }
}

/// A rendered, validated config ready to serve.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub version: IgnVersion,
    pub config: Value,
    /// The serialized JSON body.
    pub json: Bytes,
}

/// Templates (compiled once) plus the files dir for their `local` references.
pub struct Renderer {
    env: minijinja::Environment<'static>,
    templates: HashMap<String, Template>,
    files: FilesDir,
}

impl Default for Renderer {
    fn default() -> Self {
        Renderer::new()
    }
}

impl Renderer {
    pub fn new() -> Renderer {
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_keep_trailing_newline(true);
        env.add_filter(
            "tojson",
            |v: minijinja::Value| -> Result<String, minijinja::Error> {
                serde_json::to_string(&v).map_err(|e| {
                    minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
                })
            },
        );
        Renderer {
            env,
            templates: HashMap::new(),
            files: FilesDir::new(),
        }
    }

    /// Adds (or replaces) a template; syntax errors are reported now, with the line.
    pub fn add_template(&mut self, t: Template) -> Result<(), Error> {
        self.env
            .add_template_owned(t.name.clone(), t.source.clone())
            .map_err(|e| Error::Template {
                name: t.name.clone(),
                message: tmpl_msg(&e),
            })?;
        self.templates.insert(t.name.clone(), t);
        Ok(())
    }

    /// Local files for Butane `local` references in templates and secrets.
    pub fn set_files(&mut self, files: FilesDir) {
        self.files = files;
    }

    pub fn files(&self) -> &FilesDir {
        &self.files
    }

    pub fn template(&self, name: &str) -> Option<&Template> {
        self.templates.get(name)
    }

    /// Loads every `*.bu`, `*.yaml`, `*.yml`, `*.ign`, `*.json` in `dir` as a template and
    /// `dir/files/` as the files dir (I/O happens here, at the edge, not while rendering).
    pub fn load_dir(dir: &std::path::Path) -> anyhow::Result<Renderer> {
        use anyhow::Context;
        let mut r = Renderer::new();
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("bu" | "yaml" | "yml" | "ign" | "json")
                )
            })
            .collect();
        names.sort();
        for p in names {
            let src =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            r.add_template(Template::new(&name, src))?;
        }
        let files = dir.join("files");
        if files.is_dir() {
            r.set_files(FilesDir::read_dir(&files)?);
        }
        Ok(r)
    }

    /// Renders template `name` for `facts` into Ignition JSON (not yet merged).
    pub fn render_template(&self, name: &str, facts: &MachineFacts) -> Result<Value, Error> {
        let t = self.templates.get(name).ok_or_else(|| Error::Template {
            name: name.into(),
            message: "no such template".into(),
        })?;
        let tmpl = self.env.get_template(name).map_err(|e| Error::Template {
            name: name.into(),
            message: tmpl_msg(&e),
        })?;
        let text = tmpl.render(facts.ctx()).map_err(|e| Error::Template {
            name: name.into(),
            message: tmpl_msg(&e),
        })?;
        let wrap = |e: Error| Error::Template {
            name: name.into(),
            message: format!("rendered output: {e}"),
        };
        match t.format {
            Format::Butane => Ok(butane::translate_with(&text, &self.files)
                .map_err(wrap)?
                .config),
            Format::Ignition => {
                let v = validate::parse_json(&text).map_err(wrap)?;
                validate::validate(&v).map_err(wrap)?;
                Ok(v)
            }
        }
    }

    /// The config machine `facts` gets: template (if any) with the secret (if any)
    /// merged on top, validated and serialized.
    pub fn render(
        &self,
        template: Option<&str>,
        facts: &MachineFacts,
        secret: Option<&IgnitionSecret>,
    ) -> Result<Rendered, Error> {
        let user = secret.map(|s| s.to_config(&self.files)).transpose()?;
        self.render_with(template, facts, user.as_ref())
    }

    /// [`Renderer::render`] with the secret already translated and validated
    /// ([`IgnitionSecret::to_config`]): the secret does not depend on the machine, so
    /// the boot side translates it once per resourceVersion and renders every machine
    /// that uses it from that.
    pub fn render_with(
        &self,
        template: Option<&str>,
        facts: &MachineFacts,
        user: Option<&Value>,
    ) -> Result<Rendered, Error> {
        let base = template
            .map(|t| self.render_template(t, facts))
            .transpose()?;
        // Each part was validated on its own; only a merge produces something new to check.
        let (config, merged) = match (base, user) {
            (Some(b), Some(u)) => (merge::merge(&b, u), true),
            (Some(c), None) => (c, false),
            (None, Some(c)) => (c.clone(), false),
            (None, None) => {
                return Err(Error::Secret(
                    "neither a template nor an ignition secret to render".into(),
                ))
            }
        };
        let version = if merged {
            validate::validate(&config)?
        } else {
            validate::version_of(&config)?
        };
        let json =
            Bytes::from(serde_json::to_vec(&config).map_err(|e| Error::Json(e.to_string()))?);
        Ok(Rendered {
            version,
            config,
            json,
        })
    }
}

fn tmpl_msg(e: &minijinja::Error) -> String {
    match e.line() {
        Some(l) => format!(
            "line {l}: {}",
            e.detail()
                .map(|d| format!("{}: {d}", e.kind()))
                .unwrap_or_else(|| e.kind().to_string())
        ),
        None => e.to_string(),
    }
}

/// Cache key of a rendered config.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RenderKey {
    pub server: String,
    /// resourceVersion of the ignition secret ("" if none).
    pub secret_revision: String,
    /// [`Template::revision`] ("" if none).
    pub template_revision: String,
}

struct CacheEntry {
    secret_revision: String,
    template_revision: String,
    /// The facts it was rendered from, when the caller keys on them too
    /// ([`RenderCache::get_or_render_for`]).
    facts: Option<MachineFacts>,
    rendered: Arc<Rendered>,
}

/// Rendered configs, one live entry per server; an entry whose secret or template
/// revision differs from the request is a miss (and is replaced). The lead's store
/// watch calls [`RenderCache::invalidate`] / [`RenderCache::clear`] on changes.
#[derive(Default)]
pub struct RenderCache {
    map: RwLock<HashMap<String, CacheEntry>>,
}

impl RenderCache {
    pub fn new() -> RenderCache {
        RenderCache::default()
    }

    /// The cached config for these revisions, if any (no allocation on a hit).
    pub fn get(
        &self,
        server: &str,
        secret_revision: &str,
        template_revision: &str,
    ) -> Option<Arc<Rendered>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.get(server)
            .filter(|e| {
                e.secret_revision == secret_revision && e.template_revision == template_revision
            })
            .map(|e| e.rendered.clone())
    }

    /// The cached config, or `render()`'s result, which is then cached. Errors are not cached.
    pub fn get_or_render(
        &self,
        key: &RenderKey,
        render: impl FnOnce() -> Result<Rendered, Error>,
    ) -> Result<Arc<Rendered>, Error> {
        if let Some(r) = self.get(&key.server, &key.secret_revision, &key.template_revision) {
            return Ok(r);
        }
        let r = Arc::new(render()?);
        self.insert(key, None, r.clone());
        Ok(r)
    }

    /// [`RenderCache::get_or_render`] that also requires the machine facts to be the
    /// ones the entry was rendered from: a Server update that changes no fact (power
    /// state, conditions) keeps the entry, one that changes a label or an address
    /// re-renders without anyone having to invalidate it.
    pub fn get_or_render_for(
        &self,
        key: &RenderKey,
        facts: &MachineFacts,
        render: impl FnOnce() -> Result<Rendered, Error>,
    ) -> Result<Arc<Rendered>, Error> {
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = map.get(&key.server).filter(|e| {
                e.secret_revision == key.secret_revision
                    && e.template_revision == key.template_revision
                    && e.facts.as_ref() == Some(facts)
            }) {
                return Ok(e.rendered.clone());
            }
        }
        let r = Arc::new(render()?);
        self.insert(key, Some(facts.clone()), r.clone());
        Ok(r)
    }

    fn insert(&self, key: &RenderKey, facts: Option<MachineFacts>, r: Arc<Rendered>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.insert(
            key.server.clone(),
            CacheEntry {
                secret_revision: key.secret_revision.clone(),
                template_revision: key.template_revision.clone(),
                facts,
                rendered: r,
            },
        );
    }

    /// Drops a server's entry (its claim, secret or server object changed).
    pub fn invalidate(&self, server: &str) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
    }

    /// Drops everything (templates reloaded).
    pub fn clear(&self) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> MachineFacts {
        MachineFacts {
            name: "server-a".into(),
            uuid: Some("38947555-7742-3448-3784-823347823834".into()),
            macs: vec!["52:54:00:12:34:56".into()],
            ips: vec!["10.199.0.10".into()],
            labels: [("rack".to_string(), "r1".to_string())].into(),
            claim_name: Some("claim-a".into()),
            claim_namespace: Some("default".into()),
            ..Default::default()
        }
    }

    const TPL: &str = "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\"\n    - path: /etc/bootplane/facts.json\n      contents:\n        inline: '{{ {\"uuid\": uuid, \"mac\": mac, \"rack\": labels.rack, \"claim\": claim.namespace ~ \"/\" ~ claim.name} | tojson }}'\n";

    #[test]
    fn template_then_secret_merge() {
        let mut r = Renderer::new();
        r.add_template(Template::new("default.bu", TPL)).unwrap();
        let secret = IgnitionSecret {
            ignition: "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/hostname\n      contents:\n        inline: override\n".into(),
            format: Some("fcos".into()),
        };
        let out = r
            .render(Some("default.bu"), &facts(), Some(&secret))
            .unwrap();
        assert_eq!(out.version, IgnVersion::V3_4);
        let files = out.config["storage"]["files"].as_array().unwrap();
        assert_eq!(files[0]["contents"]["source"], "data:,override");
        assert_eq!(files[0]["mode"], 0o644);
        let facts_json =
            String::from_utf8(validate::inline_contents(&files[1]["contents"]).unwrap()).unwrap();
        assert_eq!(
            facts_json,
            r#"{"claim":"default/claim-a","mac":"52:54:00:12:34:56","rack":"r1","uuid":"38947555-7742-3448-3784-823347823834"}"#
        );
        let only = r.render(Some("default.bu"), &facts(), None).unwrap();
        assert_eq!(
            only.config["storage"]["files"][0]["contents"]["source"],
            "data:,server-a"
        );
    }

    #[test]
    fn shipped_default_template_renders_with_and_without_labels() {
        let mut r = Renderer::new();
        r.add_template(Template::new(
            "default.bu",
            include_str!("../../ignition/default.bu"),
        ))
        .unwrap();
        let out = r.render(Some("default.bu"), &facts(), None).unwrap();
        let env =
            validate::inline_contents(&out.config["storage"]["files"][1]["contents"]).unwrap();
        assert_eq!(
            String::from_utf8(env).unwrap(),
            "BOOTPLANE_SERVER=server-a\nBOOTPLANE_UUID=38947555-7742-3448-3784-823347823834\n\
             BOOTPLANE_MAC=52:54:00:12:34:56\nBOOTPLANE_IP=10.199.0.10\n\
             BOOTPLANE_CLAIM=default/claim-a\nBOOTPLANE_RACK=r1\n"
        );
        let mut f = facts();
        f.labels.clear();
        f.uuid = None;
        let out = r.render(Some("default.bu"), &f, None).unwrap();
        assert_eq!(
            out.config["storage"]["files"][0]["contents"]["source"],
            "data:,server-a%0A"
        );
    }

    #[test]
    fn strict_undefined_and_syntax_errors() {
        let mut r = Renderer::new();
        r.add_template(Template::new(
            "t.bu",
            "variant: fcos\nversion: 1.5.0\n# {{ nosuchvar }}\n",
        ))
        .unwrap();
        let e = r.render(Some("t.bu"), &facts(), None).unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = r
            .add_template(Template::new("u.bu", "a\n{% if %}\n"))
            .unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn secret_formats() {
        let r = Renderer::new();
        let json = IgnitionSecret {
            ignition: r#"{"ignition":{"version":"3.3.0"}}"#.into(),
            format: None,
        };
        assert_eq!(
            r.render(None, &facts(), Some(&json)).unwrap().version,
            IgnVersion::V3_3
        );
        let bad = IgnitionSecret {
            ignition: "x".into(),
            format: Some("yaml".into()),
        };
        assert!(matches!(
            r.render(None, &facts(), Some(&bad)),
            Err(Error::Secret(_))
        ));
        assert!(IgnitionSecret::from_data(&BTreeMap::new()).is_err());
    }

    #[test]
    fn cache_keys_and_invalidation() {
        let c = RenderCache::new();
        let r = Renderer::new();
        let s = IgnitionSecret {
            ignition: r#"{"ignition":{"version":"3.3.0"}}"#.into(),
            format: None,
        };
        let k = RenderKey {
            server: "a".into(),
            secret_revision: "1".into(),
            template_revision: "t".into(),
        };
        let mut calls = 0;
        for _ in 0..3 {
            c.get_or_render(&k, || {
                calls += 1;
                r.render(None, &facts(), Some(&s))
            })
            .unwrap();
        }
        assert_eq!(calls, 1);
        assert!(c.get("a", "2", "t").is_none());
        assert!(c.get("a", "1", "t").is_some());
        c.invalidate("a");
        assert!(c.is_empty());

        // Keyed on the facts too: same facts hit, a changed fact re-renders.
        let mut calls = 0;
        let mut f = facts();
        for change in [false, false, true, false] {
            if change {
                f.labels.insert("rack".into(), "r9".into());
            }
            c.get_or_render_for(&k, &f, || {
                calls += 1;
                r.render(None, &f, Some(&s))
            })
            .unwrap();
        }
        assert_eq!(calls, 2);
    }
}
