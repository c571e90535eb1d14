//! Accessors for the `metadata` fields of a JSON object (name, namespace, uid,
//! resourceVersion, finalizers, deletion, labels, owners). Absent or mistyped fields
//! read as empty, never as an error. Also [`set_condition`], the one way a
//! `status.conditions` entry is written. And the name grammars: [`valid_object_name`]
//! (what `metadata.name` may be) and [`valid_dns_label`].

use serde_json::{json, Value};

/// A Kubernetes object name (a DNS subdomain, RFC 1123): at most 253 lowercase letters,
/// digits, `-` and `.`, starting and ending with a letter or digit. The one grammar of
/// `metadata.name` and `metadata.namespace` (the store), of the names the boot HTTP
/// routes take, and of references checked before they reach the store.
pub fn valid_object_name(n: &str) -> bool {
    n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && n.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// A DNS label (RFC 1123): at most 63 lowercase letters, digits and `-`, starting and
/// ending with a letter or digit (no dots).
pub fn valid_dns_label(n: &str) -> bool {
    n.len() <= 63 && !n.contains('.') && valid_object_name(n)
}

pub fn name(o: &Value) -> &str {
    o.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}
pub fn namespace(o: &Value) -> Option<&str> {
    o.pointer("/metadata/namespace").and_then(Value::as_str)
}
pub fn uid(o: &Value) -> &str {
    o.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}
pub fn resource_version(o: &Value) -> Option<u64> {
    o.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}
pub fn finalizers(o: &Value) -> Vec<String> {
    o.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}
pub fn is_deleting(o: &Value) -> bool {
    o.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}
pub fn labels(o: &Value) -> Option<&serde_json::Map<String, Value>> {
    o.pointer("/metadata/labels").and_then(Value::as_object)
}
pub fn owner_uids(o: &Value) -> Vec<&str> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// Set (or refresh) a condition in a `status.conditions` list; the transition time
/// changes only when the condition's status does. Returns whether anything changed.
pub fn set_condition(status: &mut Value, ty: &str, st: bool, reason: &str, message: &str) -> bool {
    if !status.is_object() {
        *status = json!({});
    }
    let conds = status
        .as_object_mut()
        .expect("object")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let list = conds.as_array_mut().expect("array");
    let s = if st { "True" } else { "False" };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    if let Some(c) = list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        let same = c.get("status").and_then(Value::as_str) == Some(s)
            && c.get("reason").and_then(Value::as_str) == Some(reason)
            && c.get("message").and_then(Value::as_str) == Some(message);
        if same {
            return false;
        }
        if c.get("status").and_then(Value::as_str) != Some(s) {
            c["lastTransitionTime"] = json!(now);
        }
        c["status"] = json!(s);
        c["reason"] = json!(reason);
        c["message"] = json!(message);
        return true;
    }
    list.push(json!({"type": ty, "status": s, "reason": reason, "message": message, "lastTransitionTime": now}));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_and_defaults() {
        let o = json!({"metadata": {
            "name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
            "finalizers": ["f", 3], "deletionTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"k": "v"}, "ownerReferences": [{"uid": "o1"}, {"name": "x"}],
        }});
        assert_eq!((name(&o), namespace(&o), uid(&o)), ("a", Some("ns"), "u1"));
        assert_eq!(resource_version(&o), Some(42));
        assert_eq!(finalizers(&o), ["f"]);
        assert!(is_deleting(&o));
        assert_eq!(labels(&o).and_then(|l| l.get("k")), Some(&json!("v")));
        assert_eq!(owner_uids(&o), ["o1"]);
        let e = json!({"metadata": {"deletionTimestamp": null}});
        assert_eq!((name(&e), namespace(&e), uid(&e)), ("", None, ""));
        assert_eq!(resource_version(&e), None);
        assert!(finalizers(&e).is_empty() && owner_uids(&e).is_empty());
        assert!(!is_deleting(&e) && labels(&e).is_none());
    }

    #[test]
    fn name_grammars() {
        for ok in ["a", "rack1-01", "web.example.com", "0", &"a".repeat(253)] {
            assert!(valid_object_name(ok), "{ok}");
        }
        let long = "a".repeat(254);
        for bad in [
            "", "-a", "a-", ".a", "a.", "A", "a_b", "a b", "a/b", "é", &long,
        ] {
            assert!(!valid_object_name(bad), "{bad}");
        }
        for ok in ["a", "lpar-01", "0x", &"a".repeat(63)] {
            assert!(valid_dns_label(ok), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in ["", "a.b", "-a", "a-", "A", &long] {
            assert!(!valid_dns_label(bad), "{bad}");
        }
    }
}
