//! Validation of an Ignition config: the JSON schema of its spec version (embedded,
//! from Ignition's own `config/v3_*/schema/ignition.json`) plus the semantic rules
//! Ignition enforces that a schema cannot express: absolute paths, unique paths across
//! files/directories/links, unique keys in keyed lists, modes in 0..=07777, URL schemes
//! and data URLs, `sha512-`/`sha256-` hashes, unit and drop-in names, compression types.
//!
//! Ignition 3.2 has no schema among the references; it is checked against the 3.3
//! schema (3.3 only added `kernelArguments`, which the semantic pass rejects for 3.2).

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use base64::Engine;
use serde_json::Value;

use super::{Error, IgnVersion, Issue};

static SCHEMA_3_3: &str = include_str!("schema/v3_3.json");
static SCHEMA_3_4: &str = include_str!("schema/v3_4.json");
static SCHEMA_3_5: &str = include_str!("schema/v3_5.json");

fn schema(v: IgnVersion) -> &'static jsonschema::Validator {
    static S: [OnceLock<jsonschema::Validator>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let (i, src) = match v {
        IgnVersion::V3_2 | IgnVersion::V3_3 => (0, SCHEMA_3_3),
        IgnVersion::V3_4 => (1, SCHEMA_3_4),
        IgnVersion::V3_5 => (2, SCHEMA_3_5),
    };
    S[i].get_or_init(|| {
        // The schemas are embedded at build time and covered by tests, so a failure
        // here is a build defect, not bad input.
        let doc: Value = serde_json::from_str(src).expect("embedded ignition schema is valid json");
        jsonschema::draft4::new(&doc).expect("embedded ignition schema compiles")
    })
}

/// Parses Ignition JSON text, with line/column on syntax errors.
pub fn parse_json(src: &str) -> Result<Value, Error> {
    serde_json::from_str(src).map_err(|e| Error::Json(e.to_string()))
}

/// The spec version named by `ignition.version`.
pub fn version_of(config: &Value) -> Result<IgnVersion, Error> {
    match config.pointer("/ignition/version") {
        Some(Value::String(s)) => {
            IgnVersion::parse(s).ok_or_else(|| Error::UnsupportedIgnitionVersion(s.clone()))
        }
        Some(other) => Err(Error::Invalid(vec![Issue::new(
            "ignition.version",
            format!("must be a string, got {other}"),
        )])),
        None => Err(Error::Invalid(vec![Issue::new(
            "ignition.version",
            "missing",
        )])),
    }
}

/// Validates a config fully (schema + semantics); returns its version.
pub fn validate(config: &Value) -> Result<IgnVersion, Error> {
    let v = version_of(config)?;
    let issues = check(config, v);
    if issues.is_empty() {
        Ok(v)
    } else {
        Err(Error::Invalid(issues))
    }
}

/// All schema and semantic issues of `config`, read as version `v`.
pub fn check(config: &Value, v: IgnVersion) -> Vec<Issue> {
    let schema = schema(v);
    // `is_valid` builds no error values: the common case (a valid config) costs a
    // fraction of collecting an empty error list; errors are collected only if any.
    let mut out: Vec<Issue> = if schema.is_valid(config) {
        Vec::new()
    } else {
        schema
            .iter_errors(config)
            .map(|e| Issue::new(pointer_to_path(e.instance_path().as_str()), e.to_string()))
            .collect()
    };
    if out.is_empty() {
        semantic(config, v, &mut out);
    }
    out
}

/// `/storage/files/0/path` → `storage.files[0].path`.
pub(crate) fn pointer_to_path(p: &str) -> String {
    let mut out = String::new();
    for seg in p.split('/').filter(|s| !s.is_empty()) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push('[');
            out.push_str(&seg);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}

fn arr<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().enumerate())
        .into_iter()
        .flatten()
}

fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Checks a file/directory mode (decimal in JSON) is a valid permission set.
pub(crate) fn check_mode(mode: i64) -> Result<(), String> {
    if (0..=0o7777).contains(&mode) {
        Ok(())
    } else {
        Err(format!(
            "invalid mode {mode} (octal {mode:o}): must be between 0 and 07777 (octal)"
        ))
    }
}

/// Checks a resource URL the way Ignition does: known scheme, parseable data URL.
pub(crate) fn check_url(u: &str, v: IgnVersion) -> Result<(), String> {
    if let Some(rest) = u.strip_prefix("data:") {
        let Some((meta, data)) = rest.split_once(',') else {
            return Err(format!("invalid data url {}: missing ','", short(u)));
        };
        if meta.split(';').any(|p| p == "base64") {
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| format!("invalid data url {}: bad base64: {e}", short(u)))?;
        } else {
            // Ignition's decoder accepts only ASCII and well-formed %XX escapes.
            let b = data.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if !b[i].is_ascii() {
                    return Err(format!(
                        "invalid data url {}: non-ascii character, escape it",
                        short(u)
                    ));
                }
                if b[i] == b'%' {
                    if !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                        && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
                    {
                        return Err(format!("invalid data url {}: bad %-escape", short(u)));
                    }
                    i += 3;
                } else {
                    i += 1;
                }
            }
        }
        return Ok(());
    }
    if u.starts_with("arn:") {
        if v >= IgnVersion::V3_4 {
            return Ok(());
        }
        return Err("arn: urls need ignition 3.4.0 or newer".into());
    }
    let Some((scheme, rest)) = u.split_once("://") else {
        return Err(format!("invalid url {}: no scheme", short(u)));
    };
    if !matches!(scheme, "http" | "https" | "tftp" | "s3" | "gs") {
        return Err(format!(
            "invalid url {}: unsupported scheme {scheme:?} (http, https, tftp, s3, gs, data)",
            short(u)
        ));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || u.chars().any(|c| c.is_whitespace()) {
        return Err(format!(
            "invalid url {}: missing host or contains whitespace",
            short(u)
        ));
    }
    Ok(())
}

/// Decodes the contents of an inline resource (`{"source": "data:...", "compression": ...}`),
/// gunzipping when `compression` is `gzip`. None for remote sources or malformed data.
pub fn inline_contents(resource: &Value) -> Option<Vec<u8>> {
    let src = s(resource, "source")?.strip_prefix("data:")?;
    let (meta, data) = src.split_once(',')?;
    let raw = if meta.split(';').any(|p| p == "base64") {
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .ok()?
    } else {
        percent_encoding::percent_decode_str(data).collect()
    };
    if s(resource, "compression") == Some("gzip") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(raw.as_slice()), &mut out)
            .ok()?;
        Some(out)
    } else {
        Some(raw)
    }
}

fn short(u: &str) -> String {
    if u.len() > 60 {
        let mut end = 60;
        while !u.is_char_boundary(end) {
            end -= 1;
        }
        format!("{:?}...", &u[..end])
    } else {
        format!("{u:?}")
    }
}

/// Checks a `verification.hash` value (`sha512-<128 hex>` or `sha256-<64 hex>`).
pub(crate) fn check_hash(h: &str) -> Result<(), String> {
    let ok = match h.split_once('-') {
        Some(("sha512", hex)) => hex.len() == 128 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        Some(("sha256", hex)) => hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid hash {h:?}: expected sha512-<128 hex digits> or sha256-<64 hex digits>"
        ))
    }
}

const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
];

/// Checks a systemd unit name has a unit type suffix and no path separator.
pub(crate) fn check_unit_name(n: &str) -> Result<(), String> {
    if n.contains('/')
        || !UNIT_SUFFIXES
            .iter()
            .any(|s| n.len() > s.len() && n.ends_with(s))
    {
        return Err(format!(
            "invalid unit name {n:?}: needs a unit type suffix such as .service and no '/'"
        ));
    }
    Ok(())
}

fn check_resource(r: &Value, path: &str, v: IgnVersion, out: &mut Vec<Issue>) {
    if let Some(src) = s(r, "source") {
        if let Err(e) = check_url(src, v) {
            out.push(Issue::new(format!("{path}.source"), e));
        }
    }
    if let Some(c) = s(r, "compression") {
        if !c.is_empty() && c != "gzip" {
            out.push(Issue::new(
                format!("{path}.compression"),
                format!("unsupported compression {c:?} (supported: gzip)"),
            ));
        }
    }
    if let Some(h) = r.get("verification").and_then(|x| s(x, "hash")) {
        if let Err(e) = check_hash(h) {
            out.push(Issue::new(format!("{path}.verification.hash"), e));
        }
        if s(r, "source").is_none() {
            out.push(Issue::new(
                format!("{path}.verification.hash"),
                "a hash needs a source",
            ));
        }
    }
}

fn check_owner(n: &Value, path: &str, out: &mut Vec<Issue>) {
    for key in ["user", "group"] {
        if let Some(o) = n.get(key) {
            if o.get("id").is_some_and(|x| !x.is_null())
                && o.get("name").is_some_and(|x| !x.is_null())
            {
                out.push(Issue::new(
                    format!("{path}.{key}"),
                    "set only one of id and name",
                ));
            }
        }
    }
}

fn abs(p: &str) -> bool {
    p.starts_with('/')
}

fn dupes<'a>(
    list: impl Iterator<Item = (usize, &'a Value)>,
    key: &str,
    path: &str,
    what: &str,
    out: &mut Vec<Issue>,
) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, e) in list {
        let k = match e.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) if n.as_i64() != Some(0) => n.to_string(),
            _ => continue,
        };
        if let Some(first) = seen.get(&k) {
            out.push(Issue::new(
                format!("{path}[{i}].{key}"),
                format!("duplicate {what} {k:?} (first at {path}[{first}])"),
            ));
        } else {
            seen.insert(k, i);
        }
    }
}

/// Ignition's semantic rules; appends issues with Ignition field paths.
pub(crate) fn semantic(c: &Value, v: IgnVersion, out: &mut Vec<Issue>) {
    if let Some(ign) = c.get("ignition") {
        if let Some(cfg) = ign.get("config") {
            if let Some(r) = cfg.get("replace") {
                if !r.is_null() && r.get("source").is_some_and(|s| !s.is_null()) {
                    check_resource(r, "ignition.config.replace", v, out);
                }
            }
            for (i, r) in arr(cfg, "merge") {
                let p = format!("ignition.config.merge[{i}]");
                if s(r, "source").is_none() {
                    out.push(Issue::new(&p, "source is required"));
                }
                check_resource(r, &p, v, out);
            }
        }
        if let Some(tls) = ign.get("security").and_then(|x| x.get("tls")) {
            for (i, r) in arr(tls, "certificateAuthorities") {
                let p = format!("ignition.security.tls.certificateAuthorities[{i}]");
                if s(r, "source").is_none() {
                    out.push(Issue::new(&p, "source is required"));
                }
                check_resource(r, &p, v, out);
            }
        }
    }
    if let Some(k) = c.get("kernelArguments") {
        if v < IgnVersion::V3_3 {
            out.push(Issue::new(
                "kernelArguments",
                "kernelArguments needs ignition 3.3.0 or newer",
            ));
        }
        let want: HashSet<&str> = arr(k, "shouldExist")
            .filter_map(|(_, x)| x.as_str())
            .collect();
        for (i, x) in arr(k, "shouldNotExist") {
            if let Some(a) = x.as_str().filter(|a| want.contains(a)) {
                out.push(Issue::new(
                    format!("kernelArguments.shouldNotExist[{i}]"),
                    format!("{a:?} is also in shouldExist"),
                ));
            }
        }
    }
    if let Some(st) = c.get("storage") {
        storage(st, v, out);
    }
    if let Some(sd) = c.get("systemd") {
        dupes(arr(sd, "units"), "name", "systemd.units", "unit", out);
        for (i, u) in arr(sd, "units") {
            let p = format!("systemd.units[{i}]");
            if let Some(n) = s(u, "name") {
                if let Err(e) = check_unit_name(n) {
                    out.push(Issue::new(format!("{p}.name"), e));
                }
            }
            dupes(
                arr(u, "dropins"),
                "name",
                &format!("{p}.dropins"),
                "drop-in",
                out,
            );
            for (j, d) in arr(u, "dropins") {
                if let Some(n) = s(d, "name") {
                    if !n.ends_with(".conf") || n.contains('/') {
                        out.push(Issue::new(
                            format!("{p}.dropins[{j}].name"),
                            format!("invalid drop-in name {n:?}: must end in .conf"),
                        ));
                    }
                }
            }
        }
    }
    if let Some(pw) = c.get("passwd") {
        dupes(arr(pw, "users"), "name", "passwd.users", "user", out);
        dupes(arr(pw, "groups"), "name", "passwd.groups", "group", out);
        for (i, u) in arr(pw, "users") {
            if s(u, "name").is_some_and(str::is_empty) {
                out.push(Issue::new(
                    format!("passwd.users[{i}].name"),
                    "must not be empty",
                ));
            }
            if let Some(h) = s(u, "homeDir").filter(|h| !abs(h)) {
                out.push(Issue::new(
                    format!("passwd.users[{i}].homeDir"),
                    format!("path {h:?} must be absolute"),
                ));
            }
        }
    }
}

fn storage(st: &Value, v: IgnVersion, out: &mut Vec<Issue>) {
    storage_nodes(st, v, out);
    storage_disks(st, out);
    storage_raid(st, out);
    storage_filesystems(st, out);
    storage_luks(st, v, out);
}

/// Files, directories and links: absolute, unique paths, modes, owners, contents.
fn storage_nodes(st: &Value, v: IgnVersion, out: &mut Vec<Issue>) {
    // Paths are unique across files, directories and links.
    let mut seen: HashMap<String, String> = HashMap::new();
    for kind in ["files", "directories", "links"] {
        for (i, n) in arr(st, kind) {
            let p = format!("storage.{kind}[{i}]");
            let Some(path) = s(n, "path") else { continue };
            if !abs(path) {
                out.push(Issue::new(
                    format!("{p}.path"),
                    format!("path {path:?} must be absolute"),
                ));
            }
            let norm = normalize(path);
            if let Some(first) = seen.get(&norm) {
                out.push(Issue::new(
                    format!("{p}.path"),
                    format!("duplicate path {path:?} (also at {first})"),
                ));
            } else {
                seen.insert(norm, format!("storage.{kind}[{i}]"));
            }
            if let Some(m) = n.get("mode").and_then(Value::as_i64) {
                if let Err(e) = check_mode(m) {
                    out.push(Issue::new(format!("{p}.mode"), e));
                }
            }
            check_owner(n, &p, out);
            if kind == "files" {
                if let Some(r) = n.get("contents") {
                    check_resource(r, &format!("{p}.contents"), v, out);
                }
                for (j, r) in arr(n, "append") {
                    check_resource(r, &format!("{p}.append[{j}]"), v, out);
                }
            }
            if kind == "links" && s(n, "target").is_none_or(str::is_empty) {
                out.push(Issue::new(format!("{p}.target"), "a link needs a target"));
            }
        }
    }
}

/// Disks and their partitions: unique devices, numbers and labels, valid guids.
fn storage_disks(st: &Value, out: &mut Vec<Issue>) {
    dupes(arr(st, "disks"), "device", "storage.disks", "disk", out);
    for (i, d) in arr(st, "disks") {
        let p = format!("storage.disks[{i}]");
        if let Some(dev) = s(d, "device").filter(|d| !abs(d)) {
            out.push(Issue::new(
                format!("{p}.device"),
                format!("device {dev:?} must be an absolute path"),
            ));
        }
        dupes(
            arr(d, "partitions"),
            "number",
            &format!("{p}.partitions"),
            "partition number",
            out,
        );
        dupes(
            arr(d, "partitions"),
            "label",
            &format!("{p}.partitions"),
            "partition label",
            out,
        );
        for (j, part) in arr(d, "partitions") {
            if let Some(l) = s(part, "label").filter(|l| l.chars().count() > 36) {
                out.push(Issue::new(
                    format!("{p}.partitions[{j}].label"),
                    format!("label {l:?} is longer than 36 characters"),
                ));
            }
            for key in ["typeGuid", "guid"] {
                if let Some(g) =
                    s(part, key).filter(|g| !g.is_empty() && uuid::Uuid::parse_str(g).is_err())
                {
                    out.push(Issue::new(
                        format!("{p}.partitions[{j}].{key}"),
                        format!("{g:?} is not a guid"),
                    ));
                }
            }
        }
    }
}

/// RAID arrays: unique names, known levels.
fn storage_raid(st: &Value, out: &mut Vec<Issue>) {
    dupes(arr(st, "raid"), "name", "storage.raid", "raid", out);
    for (i, r) in arr(st, "raid") {
        if let Some(l) = s(r, "level") {
            if !matches!(
                l,
                "linear"
                    | "raid0"
                    | "0"
                    | "stripe"
                    | "raid1"
                    | "1"
                    | "mirror"
                    | "raid4"
                    | "4"
                    | "raid5"
                    | "5"
                    | "raid6"
                    | "6"
                    | "raid10"
                    | "10"
            ) {
                out.push(Issue::new(
                    format!("storage.raid[{i}].level"),
                    format!("unknown raid level {l:?}"),
                ));
            }
        }
    }
}

/// Filesystems: unique, absolute devices, absolute paths, supported formats.
fn storage_filesystems(st: &Value, out: &mut Vec<Issue>) {
    dupes(
        arr(st, "filesystems"),
        "device",
        "storage.filesystems",
        "filesystem device",
        out,
    );
    for (i, f) in arr(st, "filesystems") {
        let p = format!("storage.filesystems[{i}]");
        if let Some(dev) = s(f, "device").filter(|d| !abs(d)) {
            out.push(Issue::new(
                format!("{p}.device"),
                format!("device {dev:?} must be an absolute path"),
            ));
        }
        if let Some(path) = s(f, "path").filter(|d| !abs(d)) {
            out.push(Issue::new(
                format!("{p}.path"),
                format!("path {path:?} must be absolute"),
            ));
        }
        if let Some(fmt) = s(f, "format") {
            if !matches!(
                fmt,
                "" | "ext4" | "btrfs" | "xfs" | "vfat" | "swap" | "none"
            ) {
                out.push(Issue::new(
                    format!("{p}.format"),
                    format!("unsupported filesystem format {fmt:?}"),
                ));
            }
        }
    }
}

/// LUKS volumes: unique names, absolute devices, key files, tang URLs, newer fields
/// gated by version.
fn storage_luks(st: &Value, v: IgnVersion, out: &mut Vec<Issue>) {
    dupes(arr(st, "luks"), "name", "storage.luks", "luks volume", out);
    for (i, l) in arr(st, "luks") {
        let p = format!("storage.luks[{i}]");
        if let Some(dev) = s(l, "device").filter(|d| !abs(d)) {
            out.push(Issue::new(
                format!("{p}.device"),
                format!("device {dev:?} must be an absolute path"),
            ));
        }
        if let Some(k) = l.get("keyFile") {
            check_resource(k, &format!("{p}.keyFile"), v, out);
        }
        if let Some(cl) = l.get("clevis") {
            for (j, t) in arr(cl, "tang") {
                if let Some(u) = s(t, "url") {
                    if let Err(e) = check_url(u, v) {
                        out.push(Issue::new(format!("{p}.clevis.tang[{j}].url"), e));
                    }
                }
            }
        }
        let gated = [
            ("discard", IgnVersion::V3_4),
            ("openOptions", IgnVersion::V3_4),
            ("cex", IgnVersion::V3_5),
        ];
        for (key, min) in gated {
            if l.get(key).is_some() && v < min {
                out.push(Issue::new(
                    format!("{p}.{key}"),
                    format!("{key} needs ignition {min} or newer"),
                ));
            }
        }
    }
}

/// Lexically cleans an absolute path (`//a/./b/` → `/a/b`) for duplicate detection.
fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn minimal_configs_validate_for_every_version() {
        for v in IgnVersion::ALL {
            assert_eq!(
                validate(&json!({"ignition": {"version": v.as_str()}})).unwrap(),
                v
            );
        }
    }

    #[test]
    fn rejects_unknown_version_and_schema_type_errors() {
        assert!(matches!(
            validate(&json!({"ignition": {"version": "2.2.0"}})),
            Err(Error::UnsupportedIgnitionVersion(_))
        ));
        let e = validate(
            &json!({"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": 5}]}}),
        )
        .unwrap_err();
        assert_eq!(e.issues()[0].path, "storage.files[0].path", "{e}");
    }

    #[test]
    fn semantic_rules() {
        let c = json!({"ignition": {"version": "3.3.0"}, "storage": {
            "files": [{"path": "etc/x"}, {"path": "/a", "mode": 4096}, {"path": "/a/", "contents": {"source": "ftp://x/y"}}],
            "links": [{"path": "/l"}]},
            "systemd": {"units": [{"name": "foo"}, {"name": "a.service", "dropins": [{"name": "x.txt"}]}]}});
        let e = validate(&c).unwrap_err();
        let text = e.to_string();
        for want in [
            "storage.files[0].path: path \"etc/x\" must be absolute",
            "storage.files[1].mode: invalid mode 4096",
            "storage.files[2].path: duplicate path",
            "storage.files[2].contents.source: invalid url",
            "storage.links[0].target",
            "systemd.units[0].name: invalid unit name",
            "systemd.units[1].dropins[0].name",
        ] {
            assert!(text.contains(want), "missing {want:?} in {text}");
        }
    }

    #[test]
    fn kernel_arguments_need_3_3() {
        let e = validate(
            &json!({"ignition": {"version": "3.2.0"}, "kernelArguments": {"shouldExist": ["a"]}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs ignition 3.3.0"));
    }

    #[test]
    fn urls_and_hashes() {
        assert!(check_url("data:,hello%20world", IgnVersion::V3_3).is_ok());
        assert!(check_url("data:;base64,aGVsbG8=", IgnVersion::V3_3).is_ok());
        assert!(check_url("data:;base64,!!!", IgnVersion::V3_3).is_err());
        assert!(check_url("data:,100%", IgnVersion::V3_3).is_err());
        assert!(check_url("data:,%zz", IgnVersion::V3_3).is_err());
        assert!(check_url("data:,caf\u{e9}", IgnVersion::V3_3).is_err());
        assert!(check_url("http://127.0.0.1:8080/x", IgnVersion::V3_3).is_ok());
        assert!(check_url("http:///x", IgnVersion::V3_3).is_err());
        assert!(check_url("arn:aws:s3:::b/k", IgnVersion::V3_3).is_err());
        assert!(check_hash(&format!("sha512-{}", "a".repeat(128))).is_ok());
        assert!(check_hash("sha512-abc").is_err());
        assert!(check_hash("md5-abc").is_err());
    }
}
