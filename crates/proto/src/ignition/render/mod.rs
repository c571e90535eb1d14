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
    pub(crate) fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<IgnitionSecret, Error> {
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
    /// Structural plans of the templates that have one ([`Plan`]).
    plans: HashMap<String, Plan>,
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
            plans: HashMap::new(),
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
        match Plan::build(&self.env, &t) {
            Some(p) => self.plans.insert(t.name.clone(), p),
            None => self.plans.remove(&t.name),
        };
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

    pub(crate) fn template(&self, name: &str) -> Option<&Template> {
        self.templates.get(name)
    }

    /// How many templates are loaded.
    pub(crate) fn template_count(&self) -> usize {
        self.templates.len()
    }

    /// Loads every `*.bu`, `*.yaml`, `*.yml`, `*.ign`, `*.json` in `dir` as a template and
    /// `dir/files/` as the files dir (I/O happens here, at the edge, not while rendering).
    pub(crate) fn load_dir(dir: &std::path::Path) -> anyhow::Result<Renderer> {
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
    pub(crate) fn render_template(&self, name: &str, facts: &MachineFacts) -> Result<Value, Error> {
        let t = self.templates.get(name).ok_or_else(|| Error::Template {
            name: name.into(),
            message: "no such template".into(),
        })?;
        if let Some(config) = self
            .plans
            .get(name)
            .and_then(|p| p.translate(facts, &self.files))
        {
            return Ok(config);
        }
        self.render_text(t, facts)
    }

    /// [`Renderer::render_template`] the long way: minijinja renders the text, which is
    /// then parsed and translated (and any error is reported with its line).
    fn render_text(&self, t: &Template, facts: &MachineFacts) -> Result<Value, Error> {
        let name = t.name.as_str();
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

/// Structural templating of a Butane template, so that a cold render does not run
/// minijinja and parse ~20 KB of YAML per machine (together over half of a render):
/// the template is rendered once with a sentinel in place of every fact and parsed
/// into a YAML value; a machine's render substitutes its facts into that value's
/// strings and translates the result.
///
/// This is only done where it gives exactly what rendering and parsing the text gives;
/// everything else takes the text path ([`Renderer::render_text`]):
/// - the template is plain text with `{{ var }}` expressions and nothing else (no
///   `{% %}`, `{# #}`, filters, whitespace control or other expressions), `var` being
///   one of the string facts `name`, `uuid`, `hostname`, `mac`, `ip`, `claim.name`,
///   `claim.namespace`, `labels.KEY`: its output is then the literal text with each
///   fact's string pasted in;
/// - every sentinel lands inside a quoted or block scalar value (not a plain scalar,
///   whose type and structure depend on its text; not a key, tag, anchor or comment;
///   not at the start of a line, where `---` or `...` would end the document), checked
///   by counting them in yaml-rust2's scalar events and in the parsed value;
/// - a machine's facts are non-empty and made of `[A-Za-z0-9-._:/@+=,~]`: characters
///   that are ordinary text in quoted and block scalars (no quote, backslash, line
///   break or white space, which those styles fold, escape or use for indentation), so
///   pasting them into the text yields the same scalars as pasting them into the
///   parsed strings;
/// - the parsed value deserializes to the same Butane structures as the text
///   ([`butane::same_config`]), checked once per template.
///
/// A machine whose translation reports any problem is rendered again the long way, so
/// error messages (with line numbers of the rendered text) are unchanged.
struct Plan {
    /// The fact behind sentinel `i`.
    vars: Vec<Var>,
    /// The template rendered with sentinels, parsed.
    doc: serde_norway::Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    Name,
    Uuid,
    Hostname,
    Mac,
    Ip,
    ClaimName,
    ClaimNamespace,
    Label(String),
}

/// A sentinel is `OPEN`, the private-use character `FIRST + i`, `CLOSE`.
const SENTINEL_OPEN: char = '\u{E000}';
const SENTINEL_CLOSE: char = '\u{E001}';
const SENTINEL_FIRST: u32 = 0xE100;
const MAX_VARS: usize = 256;

fn is_sentinel_char(c: char) -> bool {
    ('\u{E000}'..='\u{E1FF}').contains(&c)
}

fn sentinel(i: usize) -> String {
    let c = char::from_u32(SENTINEL_FIRST + i as u32).unwrap_or(SENTINEL_CLOSE);
    format!("{SENTINEL_OPEN}{c}{SENTINEL_CLOSE}")
}

impl Var {
    fn parse(expr: &str) -> Option<Var> {
        let v = match expr.trim_matches(|c: char| c == ' ' || c == '\t') {
            "name" => Var::Name,
            "uuid" => Var::Uuid,
            "hostname" => Var::Hostname,
            "mac" => Var::Mac,
            "ip" => Var::Ip,
            "claim.name" => Var::ClaimName,
            "claim.namespace" => Var::ClaimNamespace,
            e => {
                let k = e.strip_prefix("labels.")?;
                let ident = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !ident {
                    return None;
                }
                Var::Label(k.to_string())
            }
        };
        Some(v)
    }

    /// The string minijinja prints for this fact; None for a missing label.
    fn value<'a>(&self, facts: &'a MachineFacts, ctx: &Ctx<'a>) -> Option<&'a str> {
        Some(match self {
            Var::Name => ctx.name,
            Var::Uuid => ctx.uuid,
            Var::Hostname => ctx.hostname,
            Var::Mac => ctx.mac,
            Var::Ip => ctx.ip,
            Var::ClaimName => ctx.claim.name,
            Var::ClaimNamespace => ctx.claim.namespace,
            Var::Label(k) => facts.labels.get(k)?.as_str(),
        })
    }
}

/// See [`Plan`]: non-empty, and only characters that are plain text in quoted and block
/// scalars.
fn safe_fact(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:/@+=,~".contains(&b))
}

impl Plan {
    /// The plan of template `t` (already added to `env`), if it has one.
    fn build(env: &minijinja::Environment<'static>, t: &Template) -> Option<Plan> {
        if t.format != Format::Butane
            || t.source.contains("{%")
            || t.source.contains("{#")
            || t.source.chars().any(is_sentinel_char)
        {
            return None;
        }
        let mut vars = Vec::new();
        let mut rest = t.source.as_str();
        while let Some(i) = rest.find("{{") {
            let after = &rest[i + 2..];
            let j = after.find("}}")?;
            let var = Var::parse(&after[..j])?;
            if !vars.contains(&var) {
                vars.push(var);
            }
            rest = &after[j + 2..];
        }
        if vars.len() > MAX_VARS {
            return None;
        }
        // The context with a sentinel for every fact the template uses.
        let mut ctx = serde_json::Map::new();
        let mut claim = serde_json::Map::new();
        let mut labels = serde_json::Map::new();
        for (i, v) in vars.iter().enumerate() {
            let s = Value::String(sentinel(i));
            match v {
                Var::Name => ctx.insert("name".into(), s),
                Var::Uuid => ctx.insert("uuid".into(), s),
                Var::Hostname => ctx.insert("hostname".into(), s),
                Var::Mac => ctx.insert("mac".into(), s),
                Var::Ip => ctx.insert("ip".into(), s),
                Var::ClaimName => claim.insert("name".into(), s),
                Var::ClaimNamespace => claim.insert("namespace".into(), s),
                Var::Label(k) => labels.insert(k.clone(), s),
            };
        }
        ctx.insert("claim".into(), Value::Object(claim));
        ctx.insert("labels".into(), Value::Object(labels));
        let text = env.get_template(&t.name).ok()?.render(&ctx).ok()?;
        let mut n = 0;
        for (i, _) in text.match_indices(SENTINEL_OPEN) {
            if i == 0 || matches!(text.as_bytes()[i - 1], b'\n' | b'\r') {
                return None;
            }
            n += 1;
        }
        if scalar_sentinels(&text)? != n {
            return None;
        }
        let doc: serde_norway::Value = serde_norway::from_str(&text).ok()?;
        if value_sentinels(&doc)? != n || !butane::same_config(&text, &doc) {
            return None;
        }
        Some(Plan { vars, doc })
    }

    /// The translated template for `facts`; None when the facts or the result need the
    /// text path.
    fn translate(&self, facts: &MachineFacts, files: &FilesDir) -> Option<Value> {
        let ctx = facts.ctx();
        let mut vals = Vec::with_capacity(self.vars.len());
        for v in &self.vars {
            let s = v.value(facts, &ctx)?;
            if !safe_fact(s) {
                return None;
            }
            vals.push(s);
        }
        let doc = fill_value(&self.doc, &vals)?;
        Some(butane::translate_parsed(doc, files)?.config)
    }
}

/// Sentinels in yaml-rust2's scalar events; None when one is in a plain or tagged
/// scalar or the text does not parse.
fn scalar_sentinels(text: &str) -> Option<usize> {
    use yaml_rust2::parser::{Event, EventReceiver, Parser};
    use yaml_rust2::scanner::TScalarStyle;
    struct Count {
        n: usize,
        ok: bool,
    }
    impl EventReceiver for Count {
        fn on_event(&mut self, ev: Event) {
            if let Event::Scalar(s, style, _, tag) = ev {
                let k = s.matches(SENTINEL_OPEN).count();
                if k > 0 && (style == TScalarStyle::Plain || tag.is_some()) {
                    self.ok = false;
                }
                self.n += k;
            }
        }
    }
    let mut c = Count { n: 0, ok: true };
    Parser::new_from_str(text).load(&mut c, false).ok()?;
    c.ok.then_some(c.n)
}

/// Sentinels in the string values of `v`; None when one is in a mapping key.
fn value_sentinels(v: &serde_norway::Value) -> Option<usize> {
    use serde_norway::Value as Y;
    Some(match v {
        Y::String(s) => s.matches(SENTINEL_OPEN).count(),
        Y::Sequence(a) => a.iter().map(value_sentinels).sum::<Option<usize>>()?,
        Y::Mapping(m) => {
            let mut n = 0;
            for (k, x) in m {
                if value_sentinels(k)? != 0 {
                    return None;
                }
                n += value_sentinels(x)?;
            }
            n
        }
        Y::Tagged(t) => value_sentinels(&t.value)?,
        _ => 0,
    })
}

/// `v` with every sentinel replaced by its fact.
fn fill_value(v: &serde_norway::Value, vals: &[&str]) -> Option<serde_norway::Value> {
    use serde_norway::Value as Y;
    Some(match v {
        Y::String(s) if s.contains(SENTINEL_OPEN) => Y::String(fill_str(s, vals)?),
        Y::Sequence(a) => Y::Sequence(
            a.iter()
                .map(|x| fill_value(x, vals))
                .collect::<Option<_>>()?,
        ),
        Y::Mapping(m) => Y::Mapping(
            m.iter()
                .map(|(k, x)| Some((k.clone(), fill_value(x, vals)?)))
                .collect::<Option<_>>()?,
        ),
        Y::Tagged(t) => Y::Tagged(Box::new(serde_norway::value::TaggedValue {
            tag: t.tag.clone(),
            value: fill_value(&t.value, vals)?,
        })),
        other => other.clone(),
    })
}

fn fill_str(s: &str, vals: &[&str]) -> Option<String> {
    let mut out = String::with_capacity(s.len() + 16 * vals.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != SENTINEL_OPEN {
            out.push(c);
            continue;
        }
        let i = (it.next()? as u32).checked_sub(SENTINEL_FIRST)? as usize;
        if it.next()? != SENTINEL_CLOSE {
            return None;
        }
        out.push_str(vals.get(i)?);
    }
    Some(out)
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
mod tests;
