//! Butane (YAML) → Ignition (JSON) translation, following coreos/butane's published
//! behaviour for the `fcos` variant (spec 1.3.0–1.6.0 → Ignition 3.2.0–3.5.0) and the
//! `flatcar` variant (1.0.0 → 3.3.0, 1.1.0 → 3.4.0).
//!
//! What it covers: `ignition` (config merge/replace, timeouts, TLS CAs, proxy),
//! `passwd` (users, groups, `ssh_authorized_keys_local`), `storage` (files with
//! inline/local/remote contents, append, compression, mode, owner, overwrite;
//! directories; links; disks/partitions; raid; filesystems with `with_mount_unit`;
//! luks; `trees`), `systemd` (units, drop-ins, enabled, mask, `contents_local`),
//! `kernel_arguments`, and `boot_device` (luks and mirror layouts for x86_64/aarch64).
//! Not covered: `grub` (rejected with a clear error), `boot_device.layout` s390x/ppc64le.
//!
//! Differences from butane, on purpose:
//! - A field a spec version does not have is an error (butane: also an error), and any
//!   unknown key is an error naming the field path and line (serde `deny_unknown_fields`).
//! - `compression: gzip` on `inline`/`local` contents that are not already gzip data
//!   gzips them (butane would pass them through as if already compressed).
//! - Inline/local contents become the shortest of a percent-encoded `data:,` URL, a
//!   `data:;base64,` URL, or (as butane does by default) gzip + base64 with
//!   `compression: gzip`; uncompressed inline contents carry `compression: ""` so a
//!   parent config's compression is never inherited, like butane.
//!
//! The translator is pure: local files come from a [`FilesDir`] the caller supplies.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{locate, merge, validate, Error, FilesDir, IgnVersion, Issue, LocalEntry};

mod data_url;
mod storage;
mod systemd;

pub use data_url::data_url;
use data_url::{cached_url, gzip};
pub use systemd::systemd_escape_path;

/// A translated config.
#[derive(Debug, Clone)]
pub struct Translated {
    pub version: IgnVersion,
    pub config: Value,
}

/// Translates Butane YAML that needs no local files.
pub fn translate(src: &str) -> Result<Translated, Error> {
    translate_with(src, &FilesDir::new())
}

/// Most bytes YAML aliases may add to a Butane config when expanded.
const MAX_ALIAS_BYTES: usize = 8 << 20;

/// Translates Butane YAML, resolving `local` references in `files`; the result has
/// passed [`validate::check`]. Errors name the field path and line.
pub fn translate_with(src: &str, files: &FilesDir) -> Result<Translated, Error> {
    #[derive(Deserialize)]
    struct Header {
        variant: Option<Value>,
        version: Option<Value>,
    }
    // Butane text comes from Secrets (API clients): bound nesting and alias expansion
    // before libyaml builds anything (deep flow nesting is quadratic in libyaml).
    crate::decode::scan_yaml(src, crate::decode::Limits::new(MAX_ALIAS_BYTES))
        .map_err(|e| Error::Yaml(e.to_string()))?;
    // Parse once optimistically; only on failure parse the header alone, so that a
    // wrong variant/version is reported as such rather than as a field error.
    let parsed: Result<Config, _> = serde_norway::from_str(src);
    let h = match &parsed {
        Ok(c) => Header {
            variant: Some(Value::String(c.variant.clone())),
            version: Some(Value::String(c.version.clone())),
        },
        Err(_) => serde_norway::from_str::<Header>(src).map_err(|e| Error::Yaml(e.to_string()))?,
    };
    let variant = match h.variant {
        Some(Value::String(s)) => s,
        Some(other) => return Err(Error::UnknownVariant(other.to_string())),
        None => {
            return Err(Error::Invalid(located(
                src,
                vec![Issue::new("variant", "missing (use variant: fcos)")],
            )))
        }
    };
    let version = match h.version {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => {
            return Err(Error::Invalid(located(
                src,
                vec![Issue::new("version", "missing (e.g. version: 1.5.0)")],
            )))
        }
    };
    let (variant, ver) = spec(&variant, version)?;
    let cfg: Config = parsed.map_err(|e| Error::Yaml(e.to_string()))?;
    let (config, issues) = translate_config(&cfg, variant, ver, files);
    if !issues.is_empty() {
        return Err(Error::Invalid(located(src, issues)));
    }
    Ok(Translated {
        version: ver,
        config,
    })
}

/// Translate typed Butane into an Ignition config, with the translation's issues and
/// then Ignition's own rules on the result (reported at the Butane field paths).
fn translate_config(
    cfg: &Config,
    variant: Variant,
    ver: IgnVersion,
    files: &FilesDir,
) -> (Value, Vec<Issue>) {
    let mut tx = Tx {
        ver,
        variant,
        files,
        issues: Vec::new(),
    };
    let config = tx.config(cfg);
    let mut issues = tx.issues;
    for mut i in validate::check(&config, ver) {
        i.path = to_butane_path(&i.path);
        if !issues
            .iter()
            .any(|x| x.path == i.path && x.message == i.message)
        {
            issues.push(i);
        }
    }
    (config, issues)
}

/// The Ignition version a Butane `variant`/`version` pair translates to.
fn spec(variant: &str, version: String) -> Result<(Variant, IgnVersion), Error> {
    let variant = match variant {
        "fcos" => Variant::Fcos,
        "flatcar" => Variant::Flatcar,
        _ => return Err(Error::UnknownVariant(variant.to_string())),
    };
    let ver = match (variant, version.as_str()) {
        (Variant::Fcos, "1.3.0") => IgnVersion::V3_2,
        (Variant::Fcos, "1.4.0") | (Variant::Flatcar, "1.0.0") => IgnVersion::V3_3,
        (Variant::Fcos, "1.5.0") | (Variant::Flatcar, "1.1.0") => IgnVersion::V3_4,
        (Variant::Fcos, "1.6.0") => IgnVersion::V3_5,
        (Variant::Fcos, _) => {
            return Err(Error::UnsupportedVersion {
                variant: "fcos".into(),
                version,
                supported: "1.3.0, 1.4.0, 1.5.0, 1.6.0",
            })
        }
        (Variant::Flatcar, _) => {
            return Err(Error::UnsupportedVersion {
                variant: "flatcar".into(),
                version,
                supported: "1.0.0, 1.1.0",
            })
        }
    };
    Ok((variant, ver))
}

/// Translates a document already parsed into a YAML value (the structural-templating
/// fast path in [`super::render`]). `None` on any error or issue: the caller then
/// translates the text with [`translate_with`], which reports located errors.
pub(super) fn translate_parsed(doc: serde_norway::Value, files: &FilesDir) -> Option<Translated> {
    let cfg: Config = serde_norway::from_value(doc).ok()?;
    let (variant, ver) = spec(&cfg.variant, cfg.version.clone()).ok()?;
    let (config, issues) = translate_config(&cfg, variant, ver, files);
    if !issues.is_empty() {
        return None;
    }
    Some(Translated {
        version: ver,
        config,
    })
}

/// Whether `src` and `doc` (`src` parsed into a YAML value) deserialize to the same
/// Butane structures: the two serde paths resolve untyped plain scalars separately, so
/// [`super::render`] checks this once per template before it uses `doc`.
pub(super) fn same_config(src: &str, doc: &serde_norway::Value) -> bool {
    let text: Result<Config, _> = serde_norway::from_str(src);
    let value: Result<Config, _> = serde_norway::from_value(doc.clone());
    match (text, value) {
        (Ok(a), Ok(b)) => format!("{a:?}") == format!("{b:?}"),
        _ => false,
    }
}

fn located(src: &str, mut issues: Vec<Issue>) -> Vec<Issue> {
    locate::annotate(src, &mut issues);
    issues
}

/// `storage.disks[0].partitions[1].sizeMiB` → `storage.disks[0].partitions[1].size_mib`.
fn to_butane_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 8);
    let mut prev_lower = false;
    for c in p.replace("MiB", "Mib").chars() {
        if c.is_ascii_uppercase() {
            if prev_lower {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            prev_lower = false;
        } else {
            out.push(c);
            prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Fcos,
    Flatcar,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Fcos => "fcos",
            Variant::Flatcar => "flatcar",
        }
    }

    /// The first spec version of this variant that maps to Ignition `v`.
    fn spec_for(self, v: IgnVersion) -> &'static str {
        match (self, v) {
            (Variant::Fcos, IgnVersion::V3_2) => "1.3.0",
            (Variant::Fcos, IgnVersion::V3_3) => "1.4.0",
            (Variant::Fcos, IgnVersion::V3_4) => "1.5.0",
            (Variant::Fcos, IgnVersion::V3_5) => "1.6.0",
            (Variant::Flatcar, IgnVersion::V3_2 | IgnVersion::V3_3) => "1.0.0",
            (Variant::Flatcar, IgnVersion::V3_4) => "1.1.0",
            (Variant::Flatcar, IgnVersion::V3_5) => "(none yet)",
        }
    }
}

// ---------------------------------------------------------------------------------
// Butane input structures. Field names are Butane's; `rename_all(serialize = ...)`
// gives Ignition's names for the parts that map one to one.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[allow(dead_code)]
    variant: String,
    #[allow(dead_code)]
    version: String,
    ignition: Option<IgnitionSec>,
    storage: Option<Storage>,
    systemd: Option<Systemd>,
    passwd: Option<Passwd>,
    kernel_arguments: Option<KernelArguments>,
    boot_device: Option<BootDevice>,
    grub: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IgnitionSec {
    config: Option<IgnConfig>,
    timeouts: Option<Timeouts>,
    security: Option<Security>,
    proxy: Option<Proxy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IgnConfig {
    merge: Option<Vec<Resource>>,
    replace: Option<Resource>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Timeouts {
    http_response_headers: Option<i64>,
    http_total: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Security {
    tls: Option<Tls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tls {
    certificate_authorities: Option<Vec<Resource>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Proxy {
    http_proxy: Option<String>,
    https_proxy: Option<String>,
    no_proxy: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resource {
    source: Option<String>,
    inline: Option<String>,
    local: Option<String>,
    compression: Option<String>,
    http_headers: Option<Vec<HttpHeader>>,
    verification: Option<Verification>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct HttpHeader {
    name: String,
    value: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Verification {
    hash: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Storage {
    disks: Option<Vec<Disk>>,
    raid: Option<Vec<Raid>>,
    filesystems: Option<Vec<Filesystem>>,
    files: Option<Vec<File>>,
    directories: Option<Vec<Directory>>,
    links: Option<Vec<Link>>,
    luks: Option<Vec<Luks>>,
    trees: Option<Vec<Tree>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Disk {
    device: String,
    wipe_table: Option<bool>,
    partitions: Option<Vec<Partition>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Partition {
    label: Option<String>,
    number: Option<i64>,
    #[serde(rename(serialize = "sizeMiB"))]
    size_mib: Option<i64>,
    #[serde(rename(serialize = "startMiB"))]
    start_mib: Option<i64>,
    type_guid: Option<String>,
    guid: Option<String>,
    wipe_partition_entry: Option<bool>,
    should_exist: Option<bool>,
    resize: Option<bool>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Raid {
    name: String,
    level: Option<String>,
    devices: Option<Vec<String>>,
    spares: Option<i64>,
    options: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Filesystem {
    device: String,
    format: Option<String>,
    path: Option<String>,
    wipe_filesystem: Option<bool>,
    label: Option<String>,
    uuid: Option<String>,
    options: Option<Vec<String>>,
    mount_options: Option<Vec<String>>,
    #[serde(skip_serializing)]
    with_mount_unit: Option<bool>,
}

/// A mode as Butane users write it: `0644` (YAML 1.1 octal, which go-yaml accepts and
/// our YAML parser hands over as a string), `0o644`, or a decimal number.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
enum ModeIn {
    Int(i64),
    Str(String),
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NodeOwner {
    id: Option<i64>,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    path: String,
    overwrite: Option<bool>,
    contents: Option<Resource>,
    append: Option<Vec<Resource>>,
    mode: Option<ModeIn>,
    user: Option<NodeOwner>,
    group: Option<NodeOwner>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Directory {
    path: String,
    overwrite: Option<bool>,
    mode: Option<ModeIn>,
    user: Option<NodeOwner>,
    group: Option<NodeOwner>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Link {
    path: String,
    overwrite: Option<bool>,
    target: Option<String>,
    hard: Option<bool>,
    user: Option<NodeOwner>,
    group: Option<NodeOwner>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Luks {
    name: String,
    device: Option<String>,
    key_file: Option<Resource>,
    label: Option<String>,
    uuid: Option<String>,
    options: Option<Vec<String>>,
    wipe_volume: Option<bool>,
    clevis: Option<Clevis>,
    discard: Option<bool>,
    open_options: Option<Vec<String>>,
    cex: Option<Cex>,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Clevis {
    tang: Option<Vec<Tang>>,
    tpm2: Option<bool>,
    threshold: Option<i64>,
    custom: Option<ClevisCustom>,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Tang {
    url: String,
    thumbprint: Option<String>,
    advertisement: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct ClevisCustom {
    pin: Option<String>,
    config: Option<String>,
    needs_network: Option<bool>,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields)]
struct Cex {
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tree {
    local: String,
    path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Systemd {
    units: Option<Vec<Unit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Unit {
    name: String,
    enabled: Option<bool>,
    mask: Option<bool>,
    contents: Option<String>,
    contents_local: Option<String>,
    dropins: Option<Vec<Dropin>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Dropin {
    name: String,
    contents: Option<String>,
    contents_local: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Passwd {
    users: Option<Vec<User>>,
    groups: Option<Vec<Group>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct User {
    name: String,
    password_hash: Option<String>,
    ssh_authorized_keys: Option<Vec<String>>,
    #[serde(skip_serializing)]
    ssh_authorized_keys_local: Option<Vec<String>>,
    uid: Option<i64>,
    gecos: Option<String>,
    home_dir: Option<String>,
    no_create_home: Option<bool>,
    primary_group: Option<String>,
    groups: Option<Vec<String>>,
    no_user_group: Option<bool>,
    no_log_init: Option<bool>,
    shell: Option<String>,
    should_exist: Option<bool>,
    system: Option<bool>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct Group {
    name: String,
    gid: Option<i64>,
    password_hash: Option<String>,
    should_exist: Option<bool>,
    system: Option<bool>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
struct KernelArguments {
    should_exist: Option<Vec<String>>,
    should_not_exist: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BootDevice {
    layout: Option<String>,
    luks: Option<BootLuks>,
    mirror: Option<Mirror>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BootLuks {
    tang: Option<Vec<Tang>>,
    threshold: Option<i64>,
    tpm2: Option<bool>,
    discard: Option<bool>,
    device: Option<String>,
    cex: Option<Cex>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mirror {
    devices: Option<Vec<String>>,
}

// ---------------------------------------------------------------------------------

struct Tx<'a> {
    ver: IgnVersion,
    variant: Variant,
    files: &'a FilesDir,
    issues: Vec<Issue>,
}

/// Serialises a one-to-one structure and drops absent (null) fields.
fn pass<T: Serialize>(v: &T) -> Value {
    let mut v = serde_json::to_value(v).unwrap_or(Value::Null);
    strip_nulls(&mut v);
    v
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn put(m: &mut Map<String, Value>, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        if !v.is_null() {
            m.insert(k.to_string(), v);
        }
    }
}

fn octal_mode(m: &ModeIn) -> Result<i64, String> {
    match m {
        ModeIn::Int(i) => Ok(*i),
        ModeIn::Str(s) => {
            let t = s.trim();
            let digits = t
                .strip_prefix("0o")
                .or_else(|| t.strip_prefix('0').filter(|r| !r.is_empty()));
            match digits {
                Some(d) if d.bytes().all(|b| (b'0'..=b'7').contains(&b)) => {
                    i64::from_str_radix(d, 8).map_err(|_| format!("invalid mode {s:?}"))
                }
                _ => Err(format!(
                    "invalid mode {s:?}: expected an octal number such as 0644"
                )),
            }
        }
    }
}

impl Tx<'_> {
    fn issue(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.issues.push(Issue::new(path, msg));
    }

    /// Records an issue if a field is used below the Ignition version that has it.
    fn need(&mut self, present: bool, path: &str, min: IgnVersion) {
        if present && self.ver < min {
            let msg = format!(
                "not supported in {} {} (needs {} {} or newer)",
                self.variant.name(),
                self.variant.spec_for(self.ver),
                self.variant.name(),
                self.variant.spec_for(min)
            );
            self.issue(path, msg);
        }
    }

    fn config(&mut self, c: &Config) -> Value {
        let mut out = Map::new();
        let mut ign = Map::new();
        ign.insert("version".into(), json!(self.ver.as_str()));
        if let Some(i) = &c.ignition {
            self.ignition_sec(i, &mut ign);
        }
        out.insert("ignition".into(), Value::Object(ign));
        if c.grub.is_some() {
            self.issue("grub", "grub is not supported by bootplane's translator (set GRUB users in the image instead)");
        }
        if let Some(k) = &c.kernel_arguments {
            if self.variant == Variant::Flatcar {
                self.issue("kernel_arguments", "not supported by the flatcar variant");
            }
            self.need(true, "kernel_arguments", IgnVersion::V3_3);
            out.insert("kernelArguments".into(), pass(k));
        }
        let mut passwd = Map::new();
        let mut storage = Map::new();
        let mut units: Vec<Value> = Vec::new();
        if let Some(p) = &c.passwd {
            self.passwd(p, &mut passwd);
        }
        if let Some(s) = &c.storage {
            self.storage(s, &mut storage, &mut units);
        }
        if let Some(sd) = &c.systemd {
            // Generated mount units are the parent; the user's units merge onto them by name.
            let own = self.systemd(sd);
            let merged = merge::merge(
                &json!({ "systemd": { "units": units } }),
                &json!({ "systemd": { "units": own } }),
            );
            units = merged
                .pointer("/systemd/units")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
        }
        if let Some(b) = &c.boot_device {
            if self.variant == Variant::Flatcar {
                self.issue("boot_device", "not supported by the flatcar variant");
            } else {
                self.boot_device(b, &mut storage);
            }
        }
        if !passwd.is_empty() {
            out.insert("passwd".into(), Value::Object(passwd));
        }
        if !storage.is_empty() {
            out.insert("storage".into(), Value::Object(storage));
        }
        if !units.is_empty() {
            out.insert("systemd".into(), json!({ "units": units }));
        }
        Value::Object(out)
    }

    fn ignition_sec(&mut self, i: &IgnitionSec, ign: &mut Map<String, Value>) {
        if let Some(c) = &i.config {
            let mut m = Map::new();
            if let Some(list) = &c.merge {
                let v: Vec<Value> = list
                    .iter()
                    .enumerate()
                    .map(|(n, r)| self.resource(r, &format!("ignition.config.merge[{n}]")))
                    .collect();
                m.insert("merge".into(), Value::Array(v));
            }
            if let Some(r) = &c.replace {
                let v = self.resource(r, "ignition.config.replace");
                m.insert("replace".into(), v);
            }
            ign.insert("config".into(), Value::Object(m));
        }
        if let Some(s) = &i.proxy {
            ign.insert("proxy".into(), pass(s));
        }
        if let Some(sec) = &i.security {
            let mut tls = Map::new();
            if let Some(cas) = sec
                .tls
                .as_ref()
                .and_then(|t| t.certificate_authorities.as_ref())
            {
                let v: Vec<Value> = cas
                    .iter()
                    .enumerate()
                    .map(|(n, r)| {
                        self.resource(
                            r,
                            &format!("ignition.security.tls.certificate_authorities[{n}]"),
                        )
                    })
                    .collect();
                tls.insert("certificateAuthorities".into(), Value::Array(v));
            }
            ign.insert("security".into(), json!({ "tls": tls }));
        }
        if let Some(t) = &i.timeouts {
            ign.insert("timeouts".into(), pass(t));
        }
    }

    /// Reads a `local` file from the files dir.
    fn local(&mut self, rel: &str, path: &str) -> Option<Vec<u8>> {
        if rel.starts_with('/') || rel.split('/').any(|s| s == "..") {
            self.issue(
                path,
                format!("local path {rel:?} must be relative to the files dir and stay inside it"),
            );
            return None;
        }
        if self.files.is_empty() {
            self.issue(
                path,
                format!("local file {rel:?} given but no files dir was provided"),
            );
            return None;
        }
        let files = self.files;
        match files.get(rel) {
            Some(LocalEntry::File { data, .. }) => Some(data.clone()),
            Some(_) => {
                self.issue(path, format!("local path {rel:?} is not a regular file"));
                None
            }
            None => {
                self.issue(
                    path,
                    format!("local file {rel:?} not found in the files dir"),
                );
                None
            }
        }
    }

    /// Translates a resource (file contents, append, config, CA).
    fn resource(&mut self, r: &Resource, path: &str) -> Value {
        let given = [r.source.is_some(), r.inline.is_some(), r.local.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if given > 1 {
            self.issue(path, "only one of source, inline and local may be given");
        }
        let mut m = Map::new();
        if let Some(c) = r
            .compression
            .as_deref()
            .filter(|c| !c.is_empty() && *c != "gzip")
        {
            self.issue(
                format!("{path}.compression"),
                format!("unsupported compression {c:?} (supported: gzip)"),
            );
        }
        let data = match (&r.inline, &r.local) {
            (Some(s), _) => Some(s.as_bytes().to_vec()),
            (None, Some(l)) => {
                let data = self.local(l, &format!("{path}.local"));
                // Like butane: a local child config must itself be a valid Ignition config.
                if let Some(d) = data
                    .as_ref()
                    .filter(|_| path.starts_with("ignition.config"))
                {
                    let checked = std::str::from_utf8(d)
                        .map_err(|_| Error::Json("not utf-8".into()))
                        .and_then(validate::parse_json)
                        .and_then(|v| validate::validate(&v));
                    if let Err(e) = checked {
                        self.issue(
                            format!("{path}.local"),
                            format!("{l:?} is not a valid ignition config: {e}"),
                        );
                    }
                }
                data
            }
            _ => None,
        };
        if let Some(data) = data {
            let (url, comp) = if r.compression.as_deref() == Some("gzip") {
                cached_url(&data, 2, |data| {
                    let b64 = base64::engine::general_purpose::STANDARD;
                    let url = if data.starts_with(&[0x1f, 0x8b]) {
                        format!("data:;base64,{}", b64.encode(data))
                    } else {
                        format!("data:;base64,{}", b64.encode(gzip(data)))
                    };
                    (url, "gzip")
                })
            } else {
                data_url(&data, true)
            };
            m.insert("compression".into(), json!(comp));
            m.insert("source".into(), json!(url));
        } else {
            put(
                &mut m,
                "compression",
                r.compression.as_ref().map(|c| json!(c)),
            );
            put(&mut m, "source", r.source.as_ref().map(|c| json!(c)));
        }
        if let Some(h) = &r.http_headers {
            m.insert("httpHeaders".into(), pass(h));
        }
        if let Some(v) = &r.verification {
            m.insert("verification".into(), pass(v));
        }
        Value::Object(m)
    }

    fn mode(&mut self, m: &Option<ModeIn>, path: &str) -> Option<Value> {
        let m = m.as_ref()?;
        match octal_mode(m).and_then(|v| validate::check_mode(v).map(|_| v)) {
            Ok(v) => Some(json!(v)),
            Err(e) => {
                self.issue(format!("{path}.mode"), e);
                None
            }
        }
    }

    fn node(
        &self,
        path: &str,
        overwrite: Option<bool>,
        user: &Option<NodeOwner>,
        group: &Option<NodeOwner>,
    ) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("path".into(), json!(path));
        put(&mut m, "overwrite", overwrite.map(Value::Bool));
        put(&mut m, "user", user.as_ref().map(pass));
        put(&mut m, "group", group.as_ref().map(pass));
        m
    }

    fn passwd(&mut self, p: &Passwd, out: &mut Map<String, Value>) {
        if let Some(users) = &p.users {
            let mut v = Vec::new();
            for (i, u) in users.iter().enumerate() {
                let mut x = pass(u);
                if let Some(locals) = &u.ssh_authorized_keys_local {
                    let at = format!("passwd.users[{i}].ssh_authorized_keys_local");
                    self.need(true, &at, IgnVersion::V3_3);
                    let mut keys: Vec<Value> = u
                        .ssh_authorized_keys
                        .iter()
                        .flatten()
                        .map(|k| json!(k))
                        .collect();
                    for (j, l) in locals.iter().enumerate() {
                        if let Some(data) = self.local(l, &format!("{at}[{j}]")) {
                            let text = String::from_utf8_lossy(&data).into_owned();
                            keys.extend(text.lines().filter(|k| !k.is_empty()).map(|k| json!(k)));
                        }
                    }
                    if let Value::Object(m) = &mut x {
                        m.insert("sshAuthorizedKeys".into(), Value::Array(keys));
                    }
                }
                v.push(x);
            }
            out.insert("users".into(), Value::Array(v));
        }
        if let Some(g) = &p.groups {
            out.insert("groups".into(), pass(g));
        }
    }
}

#[cfg(test)]
mod tests;
