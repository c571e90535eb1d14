//! `bootplane apply`: create what is missing, three-way merge what exists.
//!
//! As kubectl's client-side apply, every applied object records the manifest it was
//! applied from in the annotation [`LAST_APPLIED`]. A re-apply then builds one JSON
//! merge patch ([`three_way`]) from that last-applied manifest (what the operator set
//! before), the new manifest (what they want now) and the live object: fields that
//! differ from the live object are set, fields the last manifest had and the new one
//! lacks are removed (`null`), and fields nobody applied (a claim's `serverRef` chosen by
//! the controller, status) are left alone. An empty patch is "unchanged" with no
//! request. `--subresource=status` merge-patches the manifest's `status` onto
//! `.../status` (how an operator moves a Released Server back to Available).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::{obj_ref, read_documents, ApiFailure, Client, Conn};
use crate::model::registry::{Registry, ResourceType};

/// The annotation holding the manifest an object was last applied from (kubectl's).
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What `--dry-run` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    /// Send every change (the default).
    None,
    /// Compute and print what would change; send nothing.
    Client,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// File, directory or `-` for stdin (repeatable).
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,
    /// `client`: print what would be created or configured and change nothing.
    #[arg(long = "dry-run", value_enum, default_value = "none", num_args = 0..=1,
          default_missing_value = "client", require_equals = true)]
    pub dry_run: DryRun,
    /// `status`: apply only the manifests' `status` (PATCH `.../status`) to existing
    /// objects, e.g. to set a Released Server's `state: Available`.
    #[arg(long = "subresource", value_parser = ["status"])]
    pub subresource: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

pub fn apply(a: ApplyArgs) -> Result<u8> {
    let client = Client::new(&a.conn)?;
    let reg = Registry::global();
    let mut failed = 0;
    let mut docs = Vec::new();
    for f in &a.files {
        docs.extend(read_documents(f)?);
    }
    let opts = Opts {
        dry_run: a.dry_run == DryRun::Client,
        status: a.subresource.is_some(),
    };
    for (src, doc) in docs {
        match apply_with(&client, reg, &doc, opts) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                failed += 1;
                eprintln!("{src}: {e:#}");
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// How one document is applied.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Opts {
    /// Send nothing; say what would happen.
    pub dry_run: bool,
    /// Apply only `status`, to the status subresource.
    pub status: bool,
}

/// Where a manifest lives: its type, namespace and name.
pub(crate) fn locate<'a>(
    reg: &Registry,
    doc: &'a Value,
) -> Result<(std::sync::Arc<ResourceType>, Option<&'a str>, &'a str)> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("apiVersion is missing"))?;
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("kind is missing"))?;
    let rt = reg.by_kind(api_version, kind).ok_or_else(|| {
        anyhow::anyhow!("no matches for kind \"{kind}\" in version \"{api_version}\"")
    })?;
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("metadata.name is missing"))?;
    let ns = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let ns = if rt.namespaced { Some(ns) } else { None };
    Ok((rt, ns, name))
}

/// Create or three-way-merge one object. Returns kubectl's line (`x/y created`).
pub fn apply_one(client: &Client, reg: &Registry, doc: &Value) -> Result<String> {
    apply_with(client, reg, doc, Opts::default())
}

/// [`apply_one`] with `--dry-run` / `--subresource=status`.
pub(crate) fn apply_with(client: &Client, reg: &Registry, doc: &Value, o: Opts) -> Result<String> {
    let (rt, ns, name) = locate(reg, doc)?;
    let label = obj_ref(&rt, name);
    let dry = if o.dry_run { " (dry run)" } else { "" };
    let path = Client::path(&rt, ns, Some(name));
    let cur = match client.request("GET", &path, None) {
        Ok(cur) => Some(cur),
        Err(e)
            if e.downcast_ref::<ApiFailure>()
                .is_some_and(|f| f.code == 404) =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    if o.status {
        let Some(cur) = cur else {
            bail!(
                "{} \"{name}\" not found: --subresource=status needs an existing object",
                rt.qualified()
            );
        };
        if !rt.status_subresource {
            bail!("{} has no status subresource", rt.qualified());
        }
        let want = doc
            .get("status")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow::anyhow!("the manifest has no status mapping to apply"))?;
        let live = cur.get("status").and_then(Value::as_object);
        let empty = Map::new();
        let diff = three_way(None, want, live.unwrap_or(&empty));
        if diff.is_empty() {
            return Ok(format!("{label} unchanged{dry}"));
        }
        if !o.dry_run {
            client.request(
                "PATCH",
                &format!("{path}/status"),
                Some((
                    "application/merge-patch+json",
                    &serde_json::json!({"status": diff}),
                )),
            )?;
        }
        return Ok(format!("{label} configured{dry}"));
    }
    let modified = with_last_applied(doc)?;
    match cur {
        None => {
            // A new object is created with the manifest's status (how a Server is
            // registered with its inventory, `state: Available`); on an existing one the
            // status is the controllers' and changes only with `--subresource=status`.
            let mut body = modified;
            if let Some(st) = doc.get("status") {
                body["status"] = st.clone();
            }
            if !o.dry_run {
                client.request(
                    "POST",
                    &Client::path(&rt, ns, None),
                    Some(("application/json", &body)),
                )?;
            }
            Ok(format!("{label} created{dry}"))
        }
        Some(cur) => {
            let original: Option<Value> = cur
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(LAST_APPLIED))
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str(s).ok());
            let patch = three_way(
                original.as_ref().and_then(Value::as_object),
                modified.as_object().context("manifest is not a mapping")?,
                cur.as_object().context("server returned a non-object")?,
            );
            if patch.is_empty() {
                return Ok(format!("{label} unchanged{dry}"));
            }
            if o.dry_run {
                return Ok(format!("{label} configured{dry}"));
            }
            let res = client.request(
                "PATCH",
                &path,
                Some(("application/merge-patch+json", &Value::Object(patch))),
            )?;
            let same = res.pointer("/metadata/resourceVersion")
                == cur.pointer("/metadata/resourceVersion");
            Ok(format!(
                "{label} {}",
                if same { "unchanged" } else { "configured" }
            ))
        }
    }
}

/// The copy of a manifest the annotation records: for a Secret or BMCSecret, each key
/// of `data`/`stringData` with an empty value (the keys are what a three-way merge needs
/// to remove one; the values stay out of the annotation, which `get -o yaml` shows
/// with the object's metadata).
fn redacted(m: &Value) -> Value {
    let kind = m.get("kind").and_then(Value::as_str);
    let api = m.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let secret = (kind == Some("Secret") && api == "v1")
        || (kind == Some("BMCSecret") && api.starts_with("metal.ironcore.dev/"));
    let mut m = m.clone();
    if secret {
        for field in ["data", "stringData"] {
            if let Some(d) = m.get_mut(field).and_then(Value::as_object_mut) {
                d.values_mut()
                    .for_each(|v| *v = Value::String(String::new()));
            }
        }
    }
    m
}

/// The manifest as it is sent: without `status` (a subresource, applied with
/// `--subresource=status`) and with [`LAST_APPLIED`] holding the manifest itself.
pub(crate) fn with_last_applied(doc: &Value) -> Result<Value> {
    let mut m = doc.clone();
    let obj = m.as_object_mut().context("manifest is not a mapping")?;
    obj.remove("status");
    // The recorded manifest never holds an older record of itself.
    if let Some(a) = obj
        .get_mut("metadata")
        .and_then(|md| md.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED);
    }
    let recorded = serde_json::to_string(&redacted(&m))?;
    let md = m
        .as_object_mut()
        .and_then(|o| o.get_mut("metadata"))
        .and_then(Value::as_object_mut)
        .context("metadata is not a mapping")?;
    let ann = md
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if ann.is_null() {
        *ann = Value::Object(Map::new());
    }
    ann.as_object_mut()
        .context("metadata.annotations is not a mapping")?
        .insert(LAST_APPLIED.into(), Value::String(recorded));
    Ok(m)
}

/// The JSON merge patch (RFC 7396) taking `current` to `modified`, removing what
/// `original` (the last-applied manifest) had and `modified` no longer has. Fields
/// only `current` has (set by controllers or other clients) are kept. Empty when
/// nothing would change.
pub(crate) fn three_way(
    original: Option<&Map<String, Value>>,
    modified: &Map<String, Value>,
    current: &Map<String, Value>,
) -> Map<String, Value> {
    let mut p = Map::new();
    for (k, mv) in modified {
        match (mv, current.get(k)) {
            (Value::Object(mm), Some(Value::Object(cm))) => {
                let om = original.and_then(|o| o.get(k)).and_then(Value::as_object);
                let sub = three_way(om, mm, cm);
                if !sub.is_empty() {
                    p.insert(k.clone(), Value::Object(sub));
                }
            }
            (Value::Null, None) => {}
            (mv, Some(cv)) if mv == cv => {}
            (mv, _) => {
                p.insert(k.clone(), strip_nulls(mv));
            }
        }
    }
    if let Some(o) = original {
        for k in o.keys() {
            if !modified.contains_key(k) && current.contains_key(k) {
                p.insert(k.clone(), Value::Null);
            }
        }
    }
    p
}

/// A value set whole by a merge patch loses its nulls (RFC 7396); drop them here so
/// the patch says what the object will hold.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tw(o: Option<Value>, m: Value, c: Value) -> Value {
        Value::Object(three_way(
            o.as_ref().and_then(Value::as_object),
            m.as_object().unwrap(),
            c.as_object().unwrap(),
        ))
    }

    #[test]
    fn removed_fields_become_nulls_and_others_survive() {
        let orig = json!({"metadata": {"name": "s", "labels": {"a": "1", "b": "2"}},
                          "spec": {"x": 1, "y": 2}});
        let new = json!({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"x": 1}});
        let cur = json!({"metadata": {"name": "s", "labels": {"a": "1", "b": "2", "c": "3"},
                                       "resourceVersion": "7"},
                         "spec": {"x": 1, "y": 2, "serverRef": {"name": "m"}},
                         "status": {"state": "Available"}});
        assert_eq!(
            tw(Some(orig), new, cur),
            json!({"metadata": {"labels": {"b": null}}, "spec": {"y": null}})
        );
    }

    #[test]
    fn changes_and_additions_are_set_and_no_change_is_empty() {
        let m = json!({"spec": {"x": 2, "list": [1, 2], "new": {"k": "v", "gone": null}}});
        let c = json!({"spec": {"x": 1, "list": [1]}});
        assert_eq!(
            tw(None, m.clone(), c),
            json!({"spec": {"x": 2, "list": [1, 2], "new": {"k": "v"}}})
        );
        let c2 = json!({"spec": {"x": 2, "list": [1, 2], "new": {"k": "v"}}, "status": {}});
        assert_eq!(tw(Some(m.clone()), m, c2), json!({}));
    }

    #[test]
    fn without_a_last_applied_nothing_is_removed() {
        let m = json!({"metadata": {"labels": {"a": "1"}}});
        let c = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        assert_eq!(tw(None, m, c), json!({}));
    }

    #[test]
    fn deleting_a_field_already_gone_is_no_patch() {
        let o = json!({"spec": {"y": 1}});
        let m = json!({"spec": {}});
        let c = json!({"spec": {}});
        assert_eq!(tw(Some(o), m, c), json!({}));
    }

    #[test]
    fn a_whole_mapping_removed_is_one_null() {
        let o = json!({"metadata": {"annotations": {"x": "1"}}});
        let m = json!({"metadata": {}});
        let c = json!({"metadata": {"annotations": {"x": "1", "y": "2"}}});
        assert_eq!(
            tw(Some(o), m, c),
            json!({"metadata": {"annotations": null}})
        );
    }

    #[test]
    fn last_applied_records_the_manifest_without_status_or_itself() {
        let doc = json!({"apiVersion": "v", "kind": "K",
                         "metadata": {"name": "n", "annotations": {LAST_APPLIED: "old", "k": "v"}},
                         "status": {"state": "x"}});
        let out = with_last_applied(&doc).unwrap();
        assert!(out.get("status").is_none());
        let rec: Value = serde_json::from_str(
            out["metadata"]["annotations"][LAST_APPLIED]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            rec,
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "n", "annotations": {"k": "v"}}})
        );
        let bare = with_last_applied(&json!({"metadata": {"name": "n"}})).unwrap();
        assert!(bare["metadata"]["annotations"][LAST_APPLIED].is_string());
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_secrets_values_never_reach_the_annotation() {
        let doc = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "root"}});
        let m = with_last_applied(&doc).unwrap();
        let rec = m["metadata"]["annotations"][LAST_APPLIED].as_str().unwrap();
        assert!(
            !rec.contains("aHVudGVyMg") && !rec.contains("root"),
            "{rec}"
        );
        assert!(
            rec.contains("\"password\":\"\"") && rec.contains("\"user\":\"\""),
            "{rec}"
        );
        assert_eq!(
            m["data"]["password"], "aHVudGVyMg==",
            "the object itself keeps its data"
        );
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
        let rec = with_last_applied(&cm).unwrap();
        assert!(rec["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .unwrap()
            .contains("\"k\":\"v\""));
    }
}
