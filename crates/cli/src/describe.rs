//! `bootplane describe KIND NAME`: one object as an operator reads it, the way
//! `kubectl describe` prints it: a summary (name, labels, annotations, age), its
//! spec and status, its conditions as a table, what it refers to (`spec.*Ref`), who
//! owns it and what it owns, and its Events (oldest first). Secret and BMCSecret data
//! is never printed: only each key and its size.
//!
//! `events_query` is also what `bootplane get events --for KIND/NAME` sends.

use anyhow::{bail, Result};
use clap::Args;
use serde_json::Value;

use super::table::{age, format_rows};
use super::{resolve, Client, Conn};
use crate::model::registry::{Registry, ResourceType};

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// Resource type (`server`, `serverclaim`, `scl`, `bmc`, ...).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// Namespace of a namespaced object.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// The field selector naming the Events of one object (`involvedObject.*`), URL-encoded
/// as a `fieldSelector=` query.
pub(crate) fn events_query(rt: &ResourceType, ns: Option<&str>, name: &str) -> String {
    let mut sel = format!("involvedObject.kind={},involvedObject.name={name}", rt.kind);
    if let (true, Some(ns)) = (rt.namespaced, ns) {
        sel.push_str(&format!(",involvedObject.namespace={ns}"));
    }
    format!(
        "fieldSelector={}",
        percent_encoding::utf8_percent_encode(&sel, percent_encoding::NON_ALPHANUMERIC)
    )
}

/// `KIND/NAME` as `--for` takes it: the type and the name.
pub(crate) fn parse_for(reg: &Registry, s: &str) -> Result<(std::sync::Arc<ResourceType>, String)> {
    let Some((k, n)) = s.split_once('/') else {
        bail!("--for takes KIND/NAME (e.g. serverclaim/web-1), got {s:?}");
    };
    if n.is_empty() || n.contains('/') {
        bail!("--for takes KIND/NAME (e.g. serverclaim/web-1), got {s:?}");
    }
    Ok((resolve(reg, k)?, n.to_string()))
}

pub fn describe(a: DescribeArgs) -> Result<u8> {
    let client = Client::new(&a.conn)?;
    let reg = Registry::global();
    let rt = resolve(reg, &a.kind)?;
    let ns = rt.namespaced.then_some(a.namespace.as_str());
    let obj = client.request("GET", &Client::path(&rt, ns, Some(&a.name)), None)?;
    let t_ev = reg.by_kind("v1", "Event").expect("event type");
    let ev_ns = if rt.namespaced {
        a.namespace.as_str()
    } else {
        "default"
    };
    let events = client
        .request(
            "GET",
            &format!(
                "{}?{}",
                Client::path(&t_ev, Some(ev_ns), None),
                events_query(&rt, ns, &a.name)
            ),
            None,
        )
        .ok()
        .and_then(|v| v.get("items").and_then(Value::as_array).cloned())
        .unwrap_or_default();
    let owned = owned_objects(&client, reg, &obj);
    print!("{}", render(&rt, &obj, &owned, &events));
    Ok(0)
}

/// Objects whose `ownerReferences` name `obj` (by uid), as `Kind ns/name`.
fn owned_objects(client: &Client, reg: &Registry, obj: &Value) -> Vec<String> {
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if uid.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in &reg.types {
        if t.kind == "Event" || t.kind == "APIToken" {
            continue;
        }
        let Ok(list) = client.request("GET", &Client::path(t, None, None), None) else {
            continue;
        };
        for o in list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let owns = o
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
                });
            if owns {
                out.push(format!("{} {}", t.kind, qualified_name(t, o)));
            }
        }
    }
    out
}

fn qualified_name(rt: &ResourceType, o: &Value) -> String {
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match (
        rt.namespaced,
        o.pointer("/metadata/namespace").and_then(Value::as_str),
    ) {
        (true, Some(ns)) => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn is_secret(rt: &ResourceType) -> bool {
    (rt.kind == "Secret" && rt.group.is_empty())
        || (rt.kind == "BMCSecret" && rt.group == "metal.ironcore.dev")
}

/// The annotation `apply` keeps; too long to be worth printing.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The whole description, as text.
pub(crate) fn render(rt: &ResourceType, obj: &Value, owned: &[String], events: &[Value]) -> String {
    let mut out = String::new();
    summary(&mut out, rt, obj, owned);
    body(&mut out, rt, obj);
    conditions(&mut out, obj);
    events_table(&mut out, events);
    // Values come from machines, BMCs and other clients: no control sequence gets out.
    super::table::printable(&out, true).into_owned()
}

/// Name, namespace, kind, labels, annotations, age, owners, owned and referenced objects.
fn summary(out: &mut String, rt: &ResourceType, obj: &Value, owned: &[String]) {
    let m = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    let line = |out: &mut String, k: &str, v: &str| {
        out.push_str(&format!("{:<14}{v}\n", format!("{k}:")));
    };
    line(out, "Name", m("/metadata/name"));
    if rt.namespaced {
        line(out, "Namespace", m("/metadata/namespace"));
    }
    line(out, "Kind", &format!("{} ({})", rt.kind, rt.api_version()));
    let pairs = |p: &str, skip: &[&str]| -> String {
        let list: Vec<String> = obj
            .pointer(p)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(&v.to_string())))
            .collect();
        if list.is_empty() {
            "<none>".into()
        } else {
            list.join("\n              ")
        }
    };
    line(out, "Labels", &pairs("/metadata/labels", &[]));
    line(
        out,
        "Annotations",
        &pairs("/metadata/annotations", &[LAST_APPLIED]),
    );
    let created = m("/metadata/creationTimestamp");
    if !created.is_empty() {
        line(
            out,
            "Created",
            &format!("{created} ({} ago)", age(Some(created))),
        );
    }
    if let Some(d) = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
    {
        line(out, "Deleting", &format!("since {d}"));
    }
    let owners: Vec<String> = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{} {}",
                r.get("kind").and_then(Value::as_str).unwrap_or("?"),
                r.get("name").and_then(Value::as_str).unwrap_or("?")
            )
        })
        .collect();
    if !owners.is_empty() {
        line(out, "Owned by", &owners.join(", "));
    }
    if !owned.is_empty() {
        line(out, "Owns", &owned.join("\n              "));
    }
    let refs = references(obj.get("spec"));
    if !refs.is_empty() {
        line(out, "References", &refs.join("\n              "));
    }
}

/// Spec and status (conditions apart) as YAML; a Secret's keys and sizes only.
fn body(out: &mut String, rt: &ResourceType, obj: &Value) {
    if is_secret(rt) {
        out.push_str("Data:\n");
        for field in ["data", "stringData"] {
            for (k, v) in obj
                .get(field)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let t = v.as_str().unwrap_or("");
                let n = if field == "data" {
                    (t.len() / 4 * 3)
                        .saturating_sub(t.bytes().rev().take_while(|&b| b == b'=').count())
                } else {
                    t.len()
                };
                out.push_str(&format!("  {k}: {n} bytes\n"));
            }
        }
    } else {
        for (title, part) in [("Spec", "spec"), ("Status", "status")] {
            let mut v = obj.get(part).cloned().unwrap_or(Value::Null);
            if let Some(m) = v.as_object_mut() {
                m.remove("conditions");
            }
            if v.is_null() || v.as_object().is_some_and(|m| m.is_empty()) {
                continue;
            }
            out.push_str(&format!("{title}:\n"));
            let y = serde_norway::to_string(&v).unwrap_or_default();
            for l in y.lines() {
                out.push_str(&format!("  {l}\n"));
            }
        }
    }
}

/// `status.conditions` as a table.
fn conditions(out: &mut String, obj: &Value) {
    let conds = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !conds.is_empty() {
        out.push_str("Conditions:\n");
        let mut rows = vec![vec![
            "TYPE".to_string(),
            "STATUS".into(),
            "REASON".into(),
            "SINCE".into(),
            "MESSAGE".into(),
        ]];
        for c in &conds {
            let f = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            rows.push(vec![
                f("type"),
                f("status"),
                f("reason"),
                age(c.get("lastTransitionTime").and_then(Value::as_str)),
                f("message"),
            ]);
        }
        indent(out, &format_rows(&rows));
    }
}

/// The object's Events, oldest first.
fn events_table(out: &mut String, events: &[Value]) {
    out.push_str("Events:");
    if events.is_empty() {
        out.push_str("        <none>\n");
        return;
    }
    out.push('\n');
    let mut evs: Vec<&Value> = events.iter().collect();
    let last = |e: &Value| {
        e.get("lastTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    evs.sort_by_key(|e| last(e));
    let mut rows = vec![vec![
        "LAST SEEN".to_string(),
        "TYPE".into(),
        "REASON".into(),
        "COUNT".into(),
        "FROM".into(),
        "MESSAGE".into(),
    ]];
    for e in evs {
        let f = |p: &str| {
            e.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        rows.push(vec![
            age(e.get("lastTimestamp").and_then(Value::as_str)),
            f("/type"),
            f("/reason"),
            e.get("count")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .to_string(),
            f("/source/component"),
            f("/message"),
        ]);
    }
    indent(out, &format_rows(&rows));
}

fn indent(out: &mut String, text: &str) {
    for l in text.lines() {
        out.push_str("  ");
        out.push_str(l.trim_end());
        out.push('\n');
    }
}

/// `spec.*Ref` fields (`serverRef`, `bmcRef`, `serverClaimRef`, ...) as `field: ns/name`.
fn references(spec: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in spec.and_then(Value::as_object).into_iter().flatten() {
        if !k.ends_with("Ref") {
            continue;
        }
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            continue;
        };
        match v.get("namespace").and_then(Value::as_str) {
            Some(ns) => out.push(format!("{k}: {ns}/{name}")),
            None => out.push(format!("{k}: {name}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_summary_conditions_and_events_but_no_secret_data() {
        let reg = Registry::global();
        let claim = reg.resolve("serverclaim").unwrap();
        let obj = json!({
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {LAST_APPLIED: "{...}", "team": "a"}},
            "spec": {"serverRef": {"name": "s1"}, "power": "On"},
            "status": {"phase": "Unbound", "conditions": [{"type": "Bound", "status": "False",
                "reason": "NoMatchingServer", "message": "no server matches", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        });
        let ev = json!({"type": "Normal", "reason": "PhaseChanged", "message": "phase Unbound",
            "count": 2, "lastTimestamp": "2026-01-01T00:00:00Z", "source": {"component": "bootplane-controller"}});
        let text = render(
            &claim,
            &obj,
            &["ServerBootConfiguration default/web-1".into()],
            &[ev],
        );
        for want in [
            "Name:         web-1",
            "team=a",
            "NoMatchingServer",
            "no server matches",
            "serverRef: s1",
            "Owns:",
            "PhaseChanged",
            "phase: Unbound",
        ] {
            assert!(text.contains(want), "{want:?} missing in\n{text}");
        }
        assert!(!text.contains(LAST_APPLIED), "{text}");
        let secret = reg.resolve("secret").unwrap();
        let s = json!({"metadata": {"name": "x", "namespace": "default"}, "data": {"password": "aHVudGVyMg=="}});
        let text = render(&secret, &s, &[], &[]);
        assert!(text.contains("password: 7 bytes"), "{text}");
        assert!(!text.contains("aHVudGVyMg"), "{text}");
        assert!(text.contains("Events:        <none>"), "{text}");
    }

    #[test]
    fn for_takes_kind_slash_name() {
        let reg = Registry::global();
        let (rt, n) = parse_for(reg, "scl/web-1").unwrap();
        assert_eq!((rt.kind.as_str(), n.as_str()), ("ServerClaim", "web-1"));
        assert!(parse_for(reg, "web-1").is_err());
        assert!(parse_for(reg, "nosuchkind/x").is_err());
        let q = events_query(&rt, Some("default"), "web-1");
        assert!(
            q.starts_with("fieldSelector=involvedObject%2Ekind%3DServerClaim"),
            "{q}"
        );
    }
}
