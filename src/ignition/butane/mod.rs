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
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{locate, merge, validate, Error, FilesDir, IgnVersion, Issue, LocalEntry};

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

/// Bytes a percent-encoded data URL leaves as they are: RFC 2396 unreserved characters
/// (`A-Za-z0-9-_.!~*'()`), the same set the Go `dataurl` package butane and Ignition use.
const DATA_URL_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

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

/// gzip: inputs up to [`super::deflate::MAX_INPUT`] bytes go through the small-input
/// deflate in [`super::deflate`] (its cost scales with the input; a general-purpose
/// compressor clears over 128 KiB of tables per call), larger ones through a
/// per-thread reused miniz_oxide state at level 1. The bytes differ from butane's Go
/// gzip at any level; gzip is still kept only when it gives the shorter URL.
/// Header: mtime 0, XFL 4 (fastest), OS 255.
fn gzip(data: &[u8]) -> Vec<u8> {
    use flate2::{Compress, Compression, Crc, FlushCompress, Status};
    thread_local! {
        static DEFLATE: std::cell::RefCell<Compress> = std::cell::RefCell::new(Compress::new(Compression::fast(), false));
    }
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff]);
    if let Some(z) = super::deflate::deflate(data) {
        out.extend_from_slice(&z);
    } else {
        DEFLATE.with(|c| {
            let mut c = c.borrow_mut();
            c.reset();
            loop {
                out.reserve(data.len() / 2 + 64);
                let consumed = usize::try_from(c.total_in())
                    .unwrap_or(data.len())
                    .min(data.len());
                match c.compress_vec(&data[consumed..], &mut out, FlushCompress::Finish) {
                    Ok(Status::StreamEnd) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        });
    }
    let mut crc = Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Data URLs of file contents encoded before, by SHA-256 of the contents. A template's
/// static files and its `files/` tree are the same on every machine, and a gzip attempt
/// costs a compressor reset (~160 KB of hash tables cleared) even for a short file, so a
/// cold render of a machine re-encodes only what differs from machines rendered before.
/// Bounded two ways: two generations of at most [`URL_CACHE_ENTRIES`] entries and
/// [`URL_CACHE_BYTES`] of URLs each (an approximate LRU: a new generation starts when the
/// current one is full, the older one is dropped, and a hit in the older one is moved
/// to the current one); URLs longer than a quarter of the byte bound are not kept.
/// A URL is kept only when its contents are seen a second time: contents unique to
/// one machine (most templated files) cost a hash and a key, not a copy of the URL
/// (copying every URL made a cold render of 2,000 distinct machines slower).
struct UrlCache {
    cur: std::collections::HashMap<[u8; 33], (String, &'static str)>,
    old: std::collections::HashMap<[u8; 33], (String, &'static str)>,
    cur_bytes: usize,
    /// Keys seen once; cleared when it holds [`URL_SEEN_KEYS`].
    seen: std::collections::HashSet<[u8; 33]>,
}

const URL_SEEN_KEYS: usize = 1 << 16;

const URL_CACHE_ENTRIES: usize = 4096;
const URL_CACHE_BYTES: usize = 16 << 20;

fn url_cache() -> &'static std::sync::Mutex<UrlCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<UrlCache>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        std::sync::Mutex::new(UrlCache {
            cur: std::collections::HashMap::new(),
            old: std::collections::HashMap::new(),
            cur_bytes: 0,
            seen: std::collections::HashSet::new(),
        })
    })
}

/// `encode(data)` through the [`UrlCache`]; `mode` tells encodings of the same bytes
/// apart (auto gzip / forced gzip).
fn cached_url(
    data: &[u8],
    mode: u8,
    encode: impl FnOnce(&[u8]) -> (String, &'static str),
) -> (String, &'static str) {
    use sha2::Digest;
    let mut key = [mode; 33];
    key[..32].copy_from_slice(&sha2::Sha256::digest(data));
    {
        let mut c = url_cache().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = c.cur.get(&key) {
            return v.clone();
        }
        if let Some(v) = c.old.remove(&key) {
            c.cur_bytes += v.0.len();
            c.cur.insert(key, v.clone());
            return v;
        }
    }
    let v = encode(data);
    if v.0.len() <= URL_CACHE_BYTES / 4 {
        let mut c = url_cache().lock().unwrap_or_else(|e| e.into_inner());
        if !c.seen.remove(&key) {
            if c.seen.len() >= URL_SEEN_KEYS {
                c.seen.clear();
            }
            c.seen.insert(key);
            return v;
        }
        if c.cur.len() >= URL_CACHE_ENTRIES || c.cur_bytes + v.0.len() > URL_CACHE_BYTES {
            c.old = std::mem::take(&mut c.cur);
            c.cur_bytes = 0;
        }
        c.cur_bytes += v.0.len();
        c.cur.insert(key, v.clone());
    }
    v
}

/// Encodes contents as a data URL the way butane does: the shortest of percent-encoded
/// and base64, and (when `auto_gzip`) gzip+base64 if that is shorter even after paying
/// for the `gzip` compression value. Returns (url, compression). Contents long enough
/// to need a gzip attempt go through the [`UrlCache`].
pub fn data_url(data: &[u8], auto_gzip: bool) -> (String, &'static str) {
    if auto_gzip && data.len() >= MIN_GZIP_ATTEMPT {
        cached_url(data, 1, |d| encode_data_url(d, true))
    } else {
        encode_data_url(data, auto_gzip)
    }
}

/// Contents shorter than this never get a gzip attempt: their percent-encoded URL is at
/// most 6 + 3 * 13 = 45 bytes long (see [`encode_data_url`]), so they skip the cache.
const MIN_GZIP_ATTEMPT: usize = 14;

fn encode_data_url(data: &[u8], auto_gzip: bool) -> (String, &'static str) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut best = (
        format!(
            "data:,{}",
            percent_encoding::percent_encode(data, DATA_URL_KEEP)
        ),
        "",
    );
    // base64 is 4/3 of the input: only worth computing if it can win.
    if data.len().div_ceil(3) * 4 + 8 < best.0.len() {
        let u = format!("data:;base64,{}", b64.encode(data));
        if u.len() < best.0.len() {
            best = (u, "");
        }
    }
    // The smallest gzip stream is 20 bytes (41 URL characters): skip hopeless cases.
    if auto_gzip && best.0.len() > 45 {
        let gz = gzip(data);
        let len = "data:;base64,".len() + gz.len().div_ceil(3) * 4;
        if len + "gzip".len() < best.0.len() {
            best = (format!("data:;base64,{}", b64.encode(&gz)), "gzip");
        }
    }
    best
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

    fn storage(&mut self, s: &Storage, out: &mut Map<String, Value>, units: &mut Vec<Value>) {
        if let Some(d) = &s.disks {
            out.insert("disks".into(), pass(d));
        }
        if let Some(r) = &s.raid {
            out.insert("raid".into(), pass(r));
        }
        let mut files: Vec<Value> = Vec::new();
        let mut dirs: Vec<Value> = Vec::new();
        let mut links: Vec<Value> = Vec::new();
        for (i, f) in s.files.iter().flatten().enumerate() {
            let at = format!("storage.files[{i}]");
            let mut m = self.node(&f.path, f.overwrite, &f.user, &f.group);
            if let Some(c) = &f.contents {
                let v = self.resource(c, &format!("{at}.contents"));
                m.insert("contents".into(), v);
            }
            if let Some(a) = &f.append {
                let v: Vec<Value> = a
                    .iter()
                    .enumerate()
                    .map(|(n, r)| self.resource(r, &format!("{at}.append[{n}]")))
                    .collect();
                m.insert("append".into(), Value::Array(v));
            }
            put(&mut m, "mode", self.mode(&f.mode, &at));
            files.push(Value::Object(m));
        }
        for (i, d) in s.directories.iter().flatten().enumerate() {
            let at = format!("storage.directories[{i}]");
            let mut m = self.node(&d.path, d.overwrite, &d.user, &d.group);
            put(&mut m, "mode", self.mode(&d.mode, &at));
            dirs.push(Value::Object(m));
        }
        for l in s.links.iter().flatten() {
            let mut m = self.node(&l.path, l.overwrite, &l.user, &l.group);
            put(&mut m, "target", l.target.as_ref().map(|t| json!(t)));
            put(&mut m, "hard", l.hard.map(Value::Bool));
            links.push(Value::Object(m));
        }
        for (i, t) in s.trees.iter().flatten().enumerate() {
            self.tree(
                t,
                &format!("storage.trees[{i}]"),
                &mut files,
                &dirs,
                &mut links,
            );
        }
        if let Some(fs) = &s.filesystems {
            for (i, f) in fs.iter().enumerate() {
                if f.with_mount_unit == Some(true) {
                    let remote = s.luks.iter().flatten().any(|l| {
                        (f.device == format!("/dev/mapper/{}", l.name)
                            || f.device == format!("/dev/disk/by-id/dm-name-{}", l.name))
                            && l.clevis
                                .as_ref()
                                .and_then(|c| c.tang.as_ref())
                                .is_some_and(|t| !t.is_empty())
                    });
                    match Self::mount_unit(f, remote) {
                        Some(u) => units.push(u),
                        None => self.issue(
                            format!("storage.filesystems[{i}].with_mount_unit"),
                            "needs format and path (or format: swap) to generate a mount unit",
                        ),
                    }
                }
            }
            out.insert("filesystems".into(), pass(fs));
        }
        if !files.is_empty() {
            out.insert("files".into(), Value::Array(files));
        }
        if !dirs.is_empty() {
            out.insert("directories".into(), Value::Array(dirs));
        }
        if !links.is_empty() {
            out.insert("links".into(), Value::Array(links));
        }
        if let Some(l) = &s.luks {
            let mut v = Vec::new();
            for (i, x) in l.iter().enumerate() {
                v.push(self.luks(x, &format!("storage.luks[{i}]")));
            }
            out.insert("luks".into(), Value::Array(v));
        }
    }

    fn luks(&mut self, l: &Luks, at: &str) -> Value {
        self.need(
            l.discard.is_some(),
            &format!("{at}.discard"),
            IgnVersion::V3_4,
        );
        self.need(
            l.open_options.is_some(),
            &format!("{at}.open_options"),
            IgnVersion::V3_4,
        );
        self.need(l.cex.is_some(), &format!("{at}.cex"), IgnVersion::V3_5);
        for (j, t) in l
            .clevis
            .iter()
            .flat_map(|c| c.tang.iter().flatten())
            .enumerate()
        {
            self.need(
                t.advertisement.is_some(),
                &format!("{at}.clevis.tang[{j}].advertisement"),
                IgnVersion::V3_4,
            );
        }
        let mut m = Map::new();
        m.insert("name".into(), json!(l.name));
        put(&mut m, "device", l.device.as_ref().map(|d| json!(d)));
        if let Some(k) = &l.key_file {
            let v = self.resource(k, &format!("{at}.key_file"));
            m.insert("keyFile".into(), v);
        }
        put(&mut m, "label", l.label.as_ref().map(|d| json!(d)));
        put(&mut m, "uuid", l.uuid.as_ref().map(|d| json!(d)));
        put(&mut m, "options", l.options.as_ref().map(|d| json!(d)));
        put(&mut m, "wipeVolume", l.wipe_volume.map(Value::Bool));
        put(&mut m, "clevis", l.clevis.as_ref().map(pass));
        put(&mut m, "discard", l.discard.map(Value::Bool));
        put(
            &mut m,
            "openOptions",
            l.open_options.as_ref().map(|d| json!(d)),
        );
        put(&mut m, "cex", l.cex.as_ref().map(pass));
        Value::Object(m)
    }

    /// `storage.trees`: every file and symlink under `local` becomes a file (mode 0755
    /// if executable, else 0644) or a link under `path` (default `/`).
    fn tree(
        &mut self,
        t: &Tree,
        at: &str,
        files: &mut Vec<Value>,
        dirs: &[Value],
        links: &mut Vec<Value>,
    ) {
        if t.local.starts_with('/') || t.local.split('/').any(|s| s == "..") {
            self.issue(
                format!("{at}.local"),
                format!(
                    "local path {:?} must be relative to the files dir and stay inside it",
                    t.local
                ),
            );
            return;
        }
        if self.files.is_empty() {
            self.issue(format!("{at}.local"), "storage.trees needs a files dir");
            return;
        }
        let fd = self.files;
        match fd.get(&t.local) {
            Some(LocalEntry::Dir) => {}
            None if t.local.is_empty() || t.local == "." => {}
            _ => {
                self.issue(
                    format!("{at}.local"),
                    format!("{:?} is not a directory in the files dir", t.local),
                );
                return;
            }
        }
        let base = t.path.clone().unwrap_or_else(|| "/".to_string());
        if !base.starts_with('/') {
            self.issue(
                format!("{at}.path"),
                format!("path {base:?} must be absolute"),
            );
            return;
        }
        let base = base.trim_end_matches('/');
        let find = |list: &[Value], p: &str| list.iter().position(|x| x["path"] == p);
        for (rel, e) in fd.under(&t.local) {
            let dest = format!("{base}/{rel}");
            let exists = |files: &[Value], links: &[Value]| {
                find(files, &dest).is_some()
                    || find(links, &dest).is_some()
                    || find(dirs, &dest).is_some()
            };
            match e {
                LocalEntry::File { data, executable } => {
                    let (url, comp) = data_url(data, true);
                    let mode = if *executable { 0o755 } else { 0o644 };
                    match find(files, &dest) {
                        // An explicit entry without contents gets the tree's contents (butane).
                        Some(k) if files[k].pointer("/contents/source").is_none() => {
                            if let Value::Object(m) = &mut files[k] {
                                m.insert(
                                    "contents".into(),
                                    json!({ "compression": comp, "source": url }),
                                );
                                m.entry("mode").or_insert(json!(mode));
                            }
                        }
                        _ if exists(files, links) => {
                            self.issue(at, format!("a node already exists at {dest:?}"));
                        }
                        _ => files.push(json!({
                            "path": dest,
                            "contents": { "compression": comp, "source": url },
                            "mode": mode,
                        })),
                    }
                }
                LocalEntry::Symlink { target } => match find(links, &dest) {
                    Some(k) if files_target_missing(&links[k]) => {
                        if let Value::Object(m) = &mut links[k] {
                            m.insert("target".into(), json!(target));
                        }
                    }
                    _ if exists(files, links) => {
                        self.issue(at, format!("a node already exists at {dest:?}"));
                    }
                    _ => links.push(json!({ "path": dest, "target": target })),
                },
                LocalEntry::Dir => {}
            }
        }
    }

    /// The unit butane's `with_mount_unit` generates (same text as butane's template:
    /// no trailing newline; `_netdev` + `remote-fs.target` on a tang-bound LUKS device).
    fn mount_unit(f: &Filesystem, remote: bool) -> Option<Value> {
        let fmt = f.format.as_deref().filter(|f| !f.is_empty())?;
        let what = &f.device;
        let mut opts: Vec<&str> = f
            .mount_options
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if remote {
            opts.push("_netdev");
        }
        let options = if opts.is_empty() {
            String::new()
        } else {
            format!("\nOptions={}", opts.join(","))
        };
        if fmt == "swap" {
            let name = format!("{}.swap", systemd_escape_path(what));
            let c = format!("# Generated by Butane\n[Swap]\nWhat={what}{options}\n\n[Install]\nRequiredBy=swap.target");
            return Some(json!({ "name": name, "enabled": true, "contents": c }));
        }
        let path = f.path.as_deref()?;
        let dev = systemd_escape_path(what);
        let target = if remote {
            "remote-fs.target"
        } else {
            "local-fs.target"
        };
        let c = format!(
            "# Generated by Butane\n[Unit]\nRequires=systemd-fsck@{dev}.service\nAfter=systemd-fsck@{dev}.service\n\n\
             [Mount]\nWhere={path}\nWhat={what}\nType={fmt}{options}\n\n[Install]\nRequiredBy={target}"
        );
        Some(
            json!({ "name": format!("{}.mount", systemd_escape_path(path)), "enabled": true, "contents": c }),
        )
    }

    fn systemd(&mut self, s: &Systemd) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, u) in s.units.iter().flatten().enumerate() {
            let at = format!("systemd.units[{i}]");
            let mut m = Map::new();
            m.insert("name".into(), json!(u.name));
            put(&mut m, "enabled", u.enabled.map(Value::Bool));
            put(&mut m, "mask", u.mask.map(Value::Bool));
            let contents = self.text(&u.contents, &u.contents_local, &at);
            put(&mut m, "contents", contents.map(Value::String));
            if let Some(d) = &u.dropins {
                let mut v = Vec::new();
                for (j, x) in d.iter().enumerate() {
                    let dat = format!("{at}.dropins[{j}]");
                    let mut dm = Map::new();
                    dm.insert("name".into(), json!(x.name));
                    let c = self.text(&x.contents, &x.contents_local, &dat);
                    put(&mut dm, "contents", c.map(Value::String));
                    v.push(Value::Object(dm));
                }
                m.insert("dropins".into(), Value::Array(v));
            }
            out.push(Value::Object(m));
        }
        out
    }

    /// Unit/drop-in text from `contents` or `contents_local` (fcos 1.6+).
    fn text(
        &mut self,
        inline: &Option<String>,
        local: &Option<String>,
        at: &str,
    ) -> Option<String> {
        match (inline, local) {
            (Some(_), Some(_)) => {
                self.issue(at, "only one of contents and contents_local may be given");
                None
            }
            (Some(c), None) => Some(c.clone()),
            (None, Some(l)) => {
                let p = format!("{at}.contents_local");
                self.need(true, &p, IgnVersion::V3_5);
                let data = self.local(l, &p)?;
                match String::from_utf8(data) {
                    Ok(s) => Some(s),
                    Err(_) => {
                        self.issue(p, "unit file is not utf-8");
                        None
                    }
                }
            }
            (None, None) => None,
        }
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

    /// `boot_device`: LUKS-encrypted root and/or a mirrored boot disk, laid out like
    /// butane's fcos sugar (BIOS-BOOT 1 MiB on x86_64, EFI-SYSTEM 127 MiB, boot 384 MiB,
    /// root the rest, md RAID1 for boot and root).
    fn boot_device(&mut self, b: &BootDevice, storage: &mut Map<String, Value>) {
        let layout = b.layout.as_deref().unwrap_or("x86_64");
        if !matches!(layout, "x86_64" | "aarch64" | "ppc64le") {
            self.issue(
                "boot_device.layout",
                format!("layout {layout:?} is not supported (supported: x86_64, aarch64, ppc64le)"),
            );
            return;
        }
        let mirror: Vec<String> = b
            .mirror
            .as_ref()
            .and_then(|m| m.devices.clone())
            .unwrap_or_default();
        if b.mirror.is_some() && mirror.len() < 2 {
            self.issue(
                "boot_device.mirror.devices",
                "a mirror needs at least two devices",
            );
            return;
        }
        let mut disks = Vec::new();
        let mut raid = Vec::new();
        let mut filesystems = Vec::new();
        let mut root_dev = "/dev/disk/by-partlabel/root".to_string();
        if !mirror.is_empty() {
            let mut boots = Vec::new();
            let mut roots = Vec::new();
            for (n, dev) in mirror.iter().enumerate() {
                let k = n + 1;
                let mut parts = Vec::new();
                // Same sizes and type GUIDs as butane's v1 layout (replicating the
                // CoreOS image), so the desugared partitions are never smaller.
                const RESERVED: &str = "8DA63339-0007-60C0-C436-083AC8230908";
                let reserved =
                    json!({"label": format!("reserved-{k}"), "sizeMiB": 1, "typeGuid": RESERVED});
                match layout {
                    "x86_64" => parts.push(json!({"label": format!("bios-{k}"), "sizeMiB": 1, "typeGuid": "21686148-6449-6E6F-744E-656564454649"})),
                    "ppc64le" => parts.push(json!({"label": format!("prep-{k}"), "sizeMiB": 4, "typeGuid": "9E1A2D38-C612-4316-AA26-8B49521E5A8B"})),
                    _ => parts.push(reserved.clone()),
                }
                if layout == "ppc64le" {
                    parts.push(reserved);
                } else {
                    parts.push(json!({"label": format!("esp-{k}"), "sizeMiB": 127, "typeGuid": "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"}));
                }
                parts.push(json!({"label": format!("boot-{k}"), "sizeMiB": 384}));
                parts.push(json!({"label": format!("root-{k}")}));
                disks.push(json!({"device": dev, "partitions": parts, "wipeTable": true}));
                boots.push(format!("/dev/disk/by-partlabel/boot-{k}"));
                roots.push(format!("/dev/disk/by-partlabel/root-{k}"));
                if layout != "ppc64le" {
                    filesystems.push(json!({"device": format!("/dev/disk/by-partlabel/esp-{k}"), "format": "vfat", "label": format!("esp-{k}"), "wipeFilesystem": true}));
                }
            }
            raid.push(json!({"devices": boots, "level": "raid1", "name": "md-boot", "options": ["--metadata=1.0"]}));
            raid.push(json!({"devices": roots, "level": "raid1", "name": "md-root"}));
            filesystems.push(json!({"device": "/dev/md/md-boot", "format": "ext4", "label": "boot", "wipeFilesystem": true}));
            root_dev = "/dev/md/md-root".to_string();
        }
        let mut luks = Vec::new();
        if let Some(l) = &b.luks {
            self.need(
                l.discard.is_some(),
                "boot_device.luks.discard",
                IgnVersion::V3_4,
            );
            self.need(l.cex.is_some(), "boot_device.luks.cex", IgnVersion::V3_5);
            if let Some(d) = &l.device {
                self.need(true, "boot_device.luks.device", IgnVersion::V3_5);
                if mirror.is_empty() {
                    root_dev = d.clone();
                }
            }
            for (j, t) in l.tang.iter().flatten().enumerate() {
                self.need(
                    t.advertisement.is_some(),
                    &format!("boot_device.luks.tang[{j}].advertisement"),
                    IgnVersion::V3_4,
                );
            }
            if l.tang.as_ref().is_none_or(Vec::is_empty) && l.tpm2 != Some(true) && l.cex.is_none()
            {
                self.issue("boot_device.luks", "needs tang servers, tpm2: true or cex");
            }
            let mut clevis = Map::new();
            put(&mut clevis, "tang", l.tang.as_ref().map(pass));
            put(&mut clevis, "threshold", l.threshold.map(|t| json!(t)));
            put(&mut clevis, "tpm2", l.tpm2.map(Value::Bool));
            let mut m = Map::new();
            if !clevis.is_empty() {
                m.insert("clevis".into(), Value::Object(clevis));
            }
            put(&mut m, "cex", l.cex.as_ref().map(pass));
            m.insert("device".into(), json!(root_dev));
            put(&mut m, "discard", l.discard.map(Value::Bool));
            m.insert("label".into(), json!("luks-root"));
            m.insert("name".into(), json!("root"));
            m.insert("wipeVolume".into(), json!(true));
            luks.push(Value::Object(m));
            root_dev = "/dev/mapper/root".to_string();
        }
        if !mirror.is_empty() || !luks.is_empty() {
            filesystems.push(json!({"device": root_dev, "format": "xfs", "label": "root", "wipeFilesystem": true}));
        }
        // The sugar is the parent and the user's own storage is merged onto it by key,
        // as butane does, so explicit entries can refine generated ones.
        let mut sugar = Map::new();
        append(&mut sugar, "disks", disks);
        append(&mut sugar, "raid", raid);
        append(&mut sugar, "filesystems", filesystems);
        append(&mut sugar, "luks", luks);
        let user = std::mem::take(storage);
        let merged = merge::merge(&json!({ "storage": sugar }), &json!({ "storage": user }));
        if let Some(Value::Object(m)) = merged.get("storage") {
            *storage = m.clone();
        }
    }
}

fn files_target_missing(link: &Value) -> bool {
    link.get("target")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
}

fn append(m: &mut Map<String, Value>, key: &str, v: Vec<Value>) {
    if v.is_empty() {
        return;
    }
    match m.get_mut(key) {
        Some(Value::Array(a)) => a.extend(v),
        _ => {
            m.insert(key.into(), Value::Array(v));
        }
    }
}

/// `systemd-escape --path`: `/var/lib/x-y` → `var-lib-x\x2dy`.
pub fn systemd_escape_path(p: &str) -> String {
    let t = p.trim_matches('/');
    if t.is_empty() {
        return "-".to_string();
    }
    let mut out = String::new();
    for (i, seg) in t.split('/').filter(|s| !s.is_empty()).enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, b) in seg.bytes().enumerate() {
            let keep = b.is_ascii_alphanumeric()
                || b == b'_'
                || b == b':'
                || (b == b'.' && !(i == 0 && j == 0));
            if keep {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
