//! `bootplane patch`, `label`, `annotate` and `edit`: changing one live object.
//!
//! `patch --type merge` sends a JSON merge patch (RFC 7396) as it is. `patch --type
//! json` (RFC 6902) is applied here ([`json_patch`], `model::jsonpatch`, which the API's
//! own JSON patch uses too) to the object as read and written back with a PUT carrying the
//! read `resourceVersion`: a compare-and-swap, retried on a conflict. A patch is
//! parsed and checked whole before anything is sent, and a JSON patch is applied to a
//! copy, so a bad one changes nothing. `label`/`annotate` refuse to change an existing
//! value without `--overwrite` (kubectl's rule). `edit` opens the object as YAML in
//! `$EDITOR` (then `$VISUAL`, else `vi`); on a failure it re-opens the file with the
//! error on top as comments, and when the operator makes no further change it keeps
//! their copy in a file and says where.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::{obj_ref, resolve, ApiFailure, Client, Conn};
use crate::model::registry::{Registry, ResourceType};

/// Most bytes of a patch (the API takes 3 MiB bodies).
const MAX_PATCH: usize = 3 << 20;
/// Compare-and-swap attempts before giving up on a busy object.
const CAS_TRIES: usize = 5;

/// The patch format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PatchType {
    /// JSON merge patch (RFC 7396): a mapping; `null` removes a field.
    Merge,
    /// JSON patch (RFC 6902): a list of `{op, path, value|from}` operations.
    Json,
}

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// Resource type (`servers`, `scl`, ...).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// The patch, JSON or YAML.
    #[arg(short = 'p', long = "patch", required_unless_present = "patch_file")]
    pub patch: Option<String>,
    /// Read the patch from this file instead.
    #[arg(long = "patch-file", conflicts_with = "patch")]
    pub patch_file: Option<PathBuf>,
    /// The patch format.
    #[arg(long = "type", value_enum, default_value = "merge")]
    pub patch_type: PatchType,
    /// `status`: patch the status subresource.
    #[arg(long = "subresource", value_parser = ["status"])]
    pub subresource: Option<String>,
    /// Namespace of namespaced types.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct LabelArgs {
    /// Resource type (`servers`, `scl`, ...).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// `KEY=VALUE` to set, `KEY-` to remove (one or more).
    #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
    pub changes: Vec<String>,
    /// Replace values that are already set.
    #[arg(long)]
    pub overwrite: bool,
    /// Namespace of namespaced types.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// `annotate` takes what `label` takes.
pub type AnnotateArgs = LabelArgs;

#[derive(Debug, Args)]
pub struct EditArgs {
    /// Resource type (`servers`, `scl`, ...).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// Namespace of namespaced types.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Conn,
}

fn target(kind: &str, namespace: &str) -> Result<(Arc<ResourceType>, Option<String>)> {
    let rt = resolve(Registry::global(), kind)?;
    let ns = rt.namespaced.then(|| namespace.to_string());
    Ok((rt, ns))
}

fn is_status(e: &anyhow::Error, code: u16) -> bool {
    e.downcast_ref::<ApiFailure>()
        .is_some_and(|f| f.code == code)
}

/// Parse patch text: JSON, else YAML (one document), bounded.
pub(crate) fn parse_patch(text: &str) -> Result<Value> {
    if text.len() > MAX_PATCH {
        bail!("the patch is larger than {MAX_PATCH} bytes");
    }
    if text.trim().is_empty() {
        bail!("the patch is empty");
    }
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(v);
    }
    let limits = crate::decode::Limits::new(MAX_PATCH * 2);
    let mut docs = crate::decode::decode_yaml_documents(text, limits)
        .map_err(|e| anyhow::anyhow!("the patch is neither JSON nor YAML: {e}"))?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        0 => bail!("the patch is empty"),
        n => bail!("the patch holds {n} YAML documents, not one"),
    }
}

pub fn patch(a: PatchArgs) -> Result<u8> {
    let text = match (&a.patch, &a.patch_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let b = crate::statedir::read_bounded(f, MAX_PATCH as u64)
                .with_context(|| format!("reading {}", f.display()))?;
            String::from_utf8(b).with_context(|| format!("{} is not UTF-8", f.display()))?
        }
        (None, None) => bail!("pass the patch with -p or --patch-file"),
    };
    let p = parse_patch(&text)?;
    let ops = match a.patch_type {
        PatchType::Merge => {
            if !p.is_object() {
                bail!(
                    "a merge patch is a mapping, not {}",
                    crate::model::jsonpatch::kind_of(&p)
                );
            }
            None
        }
        PatchType::Json => Some(check_ops(&p)?),
    };
    let (rt, ns) = target(&a.kind, &a.namespace)?;
    let status = a.subresource.is_some();
    if status && !rt.status_subresource {
        bail!("{} has no status subresource", rt.qualified());
    }
    let client = Client::new(&a.conn)?;
    let path = Client::path(&rt, ns.as_deref(), Some(&a.name));
    let write_path = if status {
        format!("{path}/status")
    } else {
        path.clone()
    };
    let label = obj_ref(&rt, &a.name);
    match ops {
        None => {
            let cur = client.request("GET", &path, None)?;
            let res = client.request(
                "PATCH",
                &write_path,
                Some(("application/merge-patch+json", &p)),
            )?;
            let same = res.pointer("/metadata/resourceVersion")
                == cur.pointer("/metadata/resourceVersion");
            println!("{label} patched{}", if same { " (no change)" } else { "" });
        }
        Some(ops) => {
            for attempt in 1..=CAS_TRIES {
                let cur = client.request("GET", &path, None)?;
                let mut new = cur.clone();
                json_patch(&mut new, &ops)?;
                if new == cur {
                    println!("{label} patched (no change)");
                    return Ok(0);
                }
                // The PUT is a compare-and-swap on what was read.
                new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                match client.request("PUT", &write_path, Some(("application/json", &new))) {
                    Ok(_) => {
                        println!("{label} patched");
                        return Ok(0);
                    }
                    Err(e) if is_status(&e, 409) && attempt < CAS_TRIES => continue,
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(0)
}

/// Check a JSON patch's shape whole ([`model::jsonpatch::check_ops`]).
pub(crate) fn check_ops(p: &Value) -> Result<Vec<Value>> {
    crate::model::jsonpatch::check_ops(p).map_err(anyhow::Error::msg)
}

/// Apply a checked JSON patch, all of it or none ([`model::jsonpatch::apply`]).
pub(crate) fn json_patch(doc: &mut Value, ops: &[Value]) -> Result<()> {
    crate::model::jsonpatch::apply(doc, ops).map_err(anyhow::Error::msg)
}

/// One `label`/`annotate` argument.
#[derive(Debug, PartialEq)]
enum Change {
    Set(String, String),
    Remove(String),
}

/// A qualified key (`[prefix/]name`, as Kubernetes labels and annotations), by the
/// store's own grammar (`model::labels`), so the CLI refuses what the API would.
fn check_key(k: &str, what: &str) -> Result<()> {
    match crate::model::labels::qualified_name_error(k) {
        None => Ok(()),
        Some(why) => bail!("invalid {what} key {k:?}: {why}"),
    }
}

fn parse_changes(args: &[String], what: &str) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    for a in args {
        if let Some((k, v)) = a.split_once('=') {
            check_key(k, what)?;
            if what == "label" {
                if let Some(why) = crate::model::labels::label_value_error(v) {
                    bail!("invalid label value {v:?} for {k:?}: {why}");
                }
            } else if v.len() > 256 << 10 {
                bail!("the {what} value for {k:?} is larger than 256 KiB");
            }
            out.push(Change::Set(k.to_string(), v.to_string()));
        } else if let Some(k) = a.strip_suffix('-') {
            check_key(k, what)?;
            out.push(Change::Remove(k.to_string()));
        } else {
            bail!("{a:?} is neither KEY=VALUE nor KEY-");
        }
    }
    Ok(out)
}

pub fn label(a: LabelArgs) -> Result<u8> {
    set_meta_map(a, "labels", "label", "labeled")
}

pub fn annotate(a: AnnotateArgs) -> Result<u8> {
    set_meta_map(a, "annotations", "annotation", "annotated")
}

/// `label`/`annotate`: a merge patch of `metadata.<field>` pinned to the read
/// resourceVersion, re-read and retried on a conflict.
fn set_meta_map(a: LabelArgs, field: &str, what: &str, done: &str) -> Result<u8> {
    let changes = parse_changes(&a.changes, what)?;
    let (rt, ns) = target(&a.kind, &a.namespace)?;
    let client = Client::new(&a.conn)?;
    let path = Client::path(&rt, ns.as_deref(), Some(&a.name));
    let label = obj_ref(&rt, &a.name);
    for attempt in 1..=CAS_TRIES {
        let cur = client.request("GET", &path, None)?;
        let live = cur
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut m = Map::new();
        for c in &changes {
            match c {
                Change::Set(k, v) => match live.get(k).and_then(Value::as_str) {
                    Some(old) if old == v => {}
                    Some(old) if !a.overwrite => {
                        bail!("'{k}' already has a value ({old}), and --overwrite is false")
                    }
                    _ => {
                        m.insert(k.clone(), Value::String(v.clone()));
                    }
                },
                Change::Remove(k) => {
                    if live.contains_key(k) {
                        m.insert(k.clone(), Value::Null);
                    } else {
                        eprintln!("{what} {k:?} not found.");
                    }
                }
            }
        }
        if m.is_empty() {
            println!("{label} not {done}");
            return Ok(0);
        }
        let patch = serde_json::json!({"metadata": {
            field: m,
            "resourceVersion": cur["metadata"]["resourceVersion"],
        }});
        match client.request(
            "PATCH",
            &path,
            Some(("application/merge-patch+json", &patch)),
        ) {
            Ok(_) => {
                println!("{label} {done}");
                return Ok(0);
            }
            Err(e) if is_status(&e, 409) && attempt < CAS_TRIES => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the last attempt returns")
}

/// The editor command: `$EDITOR`, then `$VISUAL`, else `vi`.
fn editor() -> String {
    for var in ["EDITOR", "VISUAL"] {
        if let Ok(e) = std::env::var(var) {
            if !e.trim().is_empty() {
                return e;
            }
        }
    }
    "vi".into()
}

/// A new private (0600) file in the temp dir: the object may be a Secret.
fn temp_file(stem: &str) -> Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    for _ in 0..16 {
        let p = dir.join(format!(
            "bootplane-edit-{stem}-{:08x}.yaml",
            rand::random::<u32>()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", p.display())),
        }
    }
    bail!("no free temp file name in {}", dir.display())
}

/// Run the editor on `p` through the shell, as kubectl does (`$EDITOR` may hold
/// arguments).
fn run_editor(p: &Path) -> Result<()> {
    let ed = editor();
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{ed} \"$1\""))
        .arg("sh")
        .arg(p)
        .status()
        .with_context(|| format!("starting the editor {ed:?}"))?;
    if !st.success() {
        bail!("the editor {ed:?} failed ({st})");
    }
    Ok(())
}

/// Drop the `#` comment lines `edit` writes on top.
fn strip_header(text: &str) -> String {
    text.lines()
        .skip_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn edit(a: EditArgs) -> Result<u8> {
    let (rt, ns) = target(&a.kind, &a.namespace)?;
    let client = Client::new(&a.conn)?;
    let path = Client::path(&rt, ns.as_deref(), Some(&a.name));
    let label = obj_ref(&rt, &a.name);
    let cur = client.request("GET", &path, None)?;
    let (file, mut f) = temp_file(&a.name)?;
    let head = "# Please edit the object below. Lines beginning with a '#' will be ignored,\n\
                # and an empty file will abort the edit. If an error occurs while saving this file will be\n\
                # reopened with the relevant failures.\n#\n";
    let body = serde_norway::to_string(&cur)?;
    f.write_all(format!("{head}{body}").as_bytes())?;
    drop(f);
    let mut last: Option<String> = None;
    let result = loop {
        run_editor(&file)?;
        let text = crate::statedir::read_bounded(&file, MAX_PATCH as u64)
            .with_context(|| format!("reading {}", file.display()))?;
        let text = String::from_utf8(text).context("the edited file is not UTF-8")?;
        let edited = strip_header(&text);
        if edited.trim().is_empty() {
            break Ok("Edit cancelled, saved file was empty.".to_string());
        }
        if last.as_deref() == Some(edited.as_str()) {
            // The same text failed already: stop and keep the operator's copy.
            break Err(anyhow::anyhow!(
                "edit cancelled, no valid changes were saved; a copy of your changes is in {}",
                file.display()
            ));
        }
        let outcome = (|| -> Result<Option<()>> {
            let mut docs = super::parse_documents(&edited)?;
            if docs.len() != 1 {
                bail!("the edited file holds {} documents, not one", docs.len());
            }
            let new = docs.remove(0);
            if new == cur {
                return Ok(None);
            }
            // What the operator changed, as a merge patch (kubectl edit's two-way patch):
            // fields a controller wrote since the read are kept, not a conflict. The
            // resourceVersion is in the patch (a precondition) only when the operator
            // changed it.
            let (Some(was), Some(now)) = (cur.as_object(), new.as_object()) else {
                bail!("the edited document is not a mapping");
            };
            let patch = super::apply::three_way(Some(was), now, was);
            client.request(
                "PATCH",
                &path,
                Some(("application/merge-patch+json", &Value::Object(patch))),
            )?;
            Ok(Some(()))
        })();
        match outcome {
            Ok(None) => break Ok("Edit cancelled, no changes made.".to_string()),
            Ok(Some(())) => break Ok(format!("{label} edited")),
            Err(e) => {
                let msg = format!("{e:#}");
                let comment: String = msg.lines().map(|l| format!("# {l}\n")).collect();
                let text = format!("{head}# The edit failed:\n{comment}#\n{edited}\n");
                std::fs::write(&file, text)
                    .with_context(|| format!("writing {}", file.display()))?;
                eprintln!("error: {msg}");
                last = Some(edited);
            }
        }
    };
    match result {
        Ok(line) => {
            let _ = std::fs::remove_file(&file);
            println!("{line}");
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jp(doc: Value, ops: Value) -> Result<Value> {
        let ops = check_ops(&ops)?;
        let mut d = doc;
        json_patch(&mut d, &ops)?;
        Ok(d)
    }

    #[test]
    fn json_patch_ops() {
        let d = json!({"metadata": {"labels": {"a": "1", "x/y": "2"}}, "spec": {"l": [1, 2]}});
        let out = jp(
            d.clone(),
            json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "3"},
                {"op": "remove", "path": "/metadata/labels/x~1y"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
                {"op": "add", "path": "/spec/l/-", "value": 3},
                {"op": "add", "path": "/spec/l/0", "value": 0},
                {"op": "test", "path": "/spec/l/3", "value": 3},
                {"op": "copy", "from": "/spec/l", "path": "/spec/m"},
                {"op": "move", "from": "/spec/m", "path": "/spec/n"},
                {"op": "remove", "path": "/spec/l/1"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"a": "9", "b": "3"}},
                   "spec": {"l": [0, 2, 3], "n": [0, 1, 2, 3]}})
        );
    }

    #[test]
    fn a_failing_json_patch_changes_nothing_and_names_the_op() {
        let d = json!({"spec": {"a": 1}});
        let ops = check_ops(&json!([
            {"op": "replace", "path": "/spec/a", "value": 2},
            {"op": "remove", "path": "/spec/missing"},
        ]))
        .unwrap();
        let mut doc = d.clone();
        let e = json_patch(&mut doc, &ops).unwrap_err();
        assert_eq!(doc, d);
        let msg = format!("{e:#}");
        assert!(msg.contains("operation 1 (remove /spec/missing)"), "{msg}");
        assert!(msg.contains("\"missing\" not found"), "{msg}");
        let e = |p: Value| check_ops(&p).unwrap_err().to_string();
        assert!(e(json!({"op": "add"})).contains("list of operations"));
        assert!(e(json!([{"op": "frob", "path": "/a"}])).contains("unknown op \"frob\""));
        assert!(e(json!([{"op": "add", "path": "/a"}])).contains("has no \"value\""));
        assert!(e(json!([{"op": "add", "path": "a", "value": 1}])).contains("operation 0 (add)"));
        assert!(e(json!([{"op": "move", "path": "/a"}])).contains("has no \"from\""));
        let mut d2 = json!({"l": [1]});
        let bad = check_ops(&json!([{"op": "add", "path": "/l/5", "value": 1}])).unwrap();
        assert!(format!("{:#}", json_patch(&mut d2, &bad).unwrap_err()).contains("out of range"));
        let t = check_ops(&json!([{"op": "test", "path": "/l/0", "value": 2}])).unwrap();
        assert!(json_patch(&mut d2, &t).is_err());
    }

    #[test]
    fn patch_text_is_json_or_yaml() {
        assert_eq!(parse_patch(r#"{"a": 1}"#).unwrap(), json!({"a": 1}));
        assert_eq!(
            parse_patch("a: 1\nb: [x]\n").unwrap(),
            json!({"a": 1, "b": ["x"]})
        );
        assert!(parse_patch("").unwrap_err().to_string().contains("empty"));
        assert!(parse_patch("a: [1\n")
            .unwrap_err()
            .to_string()
            .contains("neither JSON nor YAML"));
        assert!(parse_patch("a: 1\n---\nb: 2\n")
            .unwrap_err()
            .to_string()
            .contains("2 YAML documents"));
    }

    #[test]
    fn label_changes_parse_and_check_keys() {
        let c = parse_changes(&["a=1".into(), "ex.com/b-".into(), "c=".into()], "label").unwrap();
        assert_eq!(
            c,
            vec![
                Change::Set("a".into(), "1".into()),
                Change::Remove("ex.com/b".into()),
                Change::Set("c".into(), "".into())
            ]
        );
        let e = |a: &str, w: &str| parse_changes(&[a.into()], w).unwrap_err().to_string();
        assert!(e("a", "label").contains("neither KEY=VALUE nor KEY-"));
        assert!(e("-a=1", "label").contains("invalid label key \"-a\""));
        assert!(e("a=b c", "label").contains("invalid label value \"b c\""));
        assert!(parse_changes(&["a=b c".into()], "annotation").is_ok());
        assert!(e("UP/x=1", "annotation").contains("invalid annotation key"));
        // The prefix is a DNS subdomain, each part starting and ending alphanumeric.
        assert!(e("a-.b/x=1", "label").contains("prefix part"));
        assert!(e(&format!("{}=1", "k".repeat(64)), "label").contains("63"));
        assert!(e(&format!("a={}", "v".repeat(64)), "label").contains("63"));
    }

    #[test]
    fn header_lines_are_dropped() {
        assert_eq!(strip_header("# a\n# b\nx: 1\n# kept\n"), "x: 1\n# kept");
    }
}
