//! Strategic merge patch (`application/strategic-merge-patch+json`) for the core kinds
//! bootplane serves (Secret, Event): what kubectl sends for built-in kinds by default
//! (`kubectl patch`, client-side `apply` and `edit` of a Secret). It is a JSON merge
//! patch (RFC 7386) plus kube's directives and per-field list strategies; these kinds
//! have two lists that merge instead of being replaced, `metadata.finalizers` (a set)
//! and `metadata.ownerReferences` (by `uid`). Directives: `$patch` (`merge`, `replace`,
//! `delete`), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and
//! `$setElementOrder/<field>` (order only: the result keeps the stored order). An unknown
//! directive is an error and nothing is changed. Custom kinds have no strategy (kube
//! answers 415 for them, and so does the API). Pure.

use serde_json::{Map, Value};

/// Lists that merge instead of being replaced: (path, merge key; `None`: a set of
/// primitives).
const MERGED_LISTS: [(&str, Option<&str>); 2] = [
    ("metadata.finalizers", None),
    ("metadata.ownerReferences", Some("uid")),
];

/// Apply `patch` (an object) to `target`. On an error `target` may be half changed:
/// callers patch a copy.
pub fn apply(target: &mut Value, patch: &Value) -> Result<(), String> {
    if !patch.is_object() {
        return Err("a strategic merge patch is a JSON object".into());
    }
    merge(target, patch, "")
}

fn merge(target: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").map(|d| d.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("replace")) => {
            *target = Value::Object(without_directives(p));
            return Ok(());
        }
        Some(Some("delete")) => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => return Err(format!("{path}: unknown $patch directive {other:?}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        let at = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let gone = v.as_array().ok_or_else(|| format!("{at}: not a list"))?;
            if let Some(Value::Array(list)) = t.get_mut(field) {
                list.retain(|x| !gone.contains(x));
                // As kube stores it: an emptied list is left out (`omitempty`).
                if list.is_empty() {
                    t.remove(field);
                }
            }
            continue;
        }
        if k.starts_with("$setElementOrder/") || k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if k.starts_with('$') {
            return Err(format!("{at}: unknown directive"));
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                merge(slot, v, &at)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            Value::Array(items) => {
                let merged = MERGED_LISTS.iter().find(|(p, _)| *p == at);
                match merged {
                    Some((_, key)) => {
                        merge_list(t.entry(k.clone()).or_insert(Value::Null), items, *key, &at)?
                    }
                    None => {
                        t.insert(k.clone(), Value::Array(items.iter().map(strip).collect()));
                    }
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(keep) = p.get("$retainKeys") {
        let keep = keep
            .as_array()
            .ok_or_else(|| format!("{path}: $retainKeys is not a list"))?;
        t.retain(|k, _| keep.iter().any(|x| x == k));
    }
    Ok(())
}

/// A merged list: primitives added when absent (`key` None), objects merged into the
/// element with the same `key` value or appended, or removed with `$patch: delete`.
/// Linear in the two lists (an index of the target's elements, not a search per patch
/// element: a patch of tens of thousands of elements must not cost their square).
fn merge_list(
    target: &mut Value,
    items: &[Value],
    key: Option<&str>,
    at: &str,
) -> Result<(), String> {
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let list = target.as_array_mut().expect("array");
    // Each element's identity as its JSON text (the value itself, or its key's value).
    let id_of = |v: &Value| -> Option<String> {
        match key {
            None => Some(v.to_string()),
            Some(k) => v.get(k).map(Value::to_string),
        }
    };
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, v) in list.iter().enumerate() {
        if let Some(id) = id_of(v) {
            index.entry(id).or_insert(i);
        }
    }
    let mut deleted = vec![false; list.len()];
    for item in items {
        let id =
            id_of(item).ok_or_else(|| format!("{at}: an element without {}", key.unwrap_or("")))?;
        let delete = key.is_some() && item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (index.get(&id).copied(), delete) {
            (Some(i), true) => {
                if let Some(d) = deleted.get_mut(i) {
                    *d = true;
                }
                index.remove(&id);
            }
            (None, true) => {}
            (Some(i), false) if key.is_some() => merge(&mut list[i], item, at)?,
            (Some(_), false) => {}
            (None, false) => {
                index.insert(id, list.len());
                list.push(if key.is_some() {
                    strip(item)
                } else {
                    item.clone()
                });
                deleted.push(false);
            }
        }
    }
    let mut n = 0;
    list.retain(|_| {
        let keep = !deleted[n];
        n += 1;
        keep
    });
    Ok(())
}

/// `v` without directives (`$...` keys), at every depth.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(without_directives(m)),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn without_directives(m: &Map<String, Value>) -> Map<String, Value> {
    (m.iter())
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(t: Value, p: Value) -> Value {
        let mut t = t;
        apply(&mut t, &p).unwrap();
        t
    }

    #[test]
    fn maps_merge_and_null_deletes_as_merge_patch() {
        let t = json!({"metadata": {"name": "s", "labels": {"a": "1", "b": "2"}}, "data": {"k": "dg=="}, "type": "Opaque"});
        let p = json!({"metadata": {"labels": {"a": null, "c": "3"}}, "data": {"j": "dw=="}});
        assert_eq!(
            patched(t, p),
            json!({"metadata": {"name": "s", "labels": {"b": "2", "c": "3"}}, "data": {"k": "dg==", "j": "dw=="}, "type": "Opaque"})
        );
    }

    #[test]
    fn directives_as_kubectl_sends_them() {
        let t = json!({"metadata": {"finalizers": ["a", "b"], "ownerReferences": [
            {"uid": "1", "name": "x", "kind": "K", "apiVersion": "v1"},
            {"uid": "2", "name": "y", "kind": "K", "apiVersion": "v1"}]},
            "data": {"k": "dg==", "j": "dw=="}});
        let p = json!({
            "$setElementOrder/data": [{"k": 1}],
            "metadata": {
                "finalizers": ["c", "a"],
                "$deleteFromPrimitiveList/finalizers": ["b"],
                "ownerReferences": [{"uid": "1", "name": "x2"}, {"uid": "2", "$patch": "delete"},
                    {"uid": "3", "name": "z", "kind": "K", "apiVersion": "v1"}],
            },
            "data": {"$patch": "replace", "n": "bg=="},
        });
        assert_eq!(
            patched(t, p),
            json!({"metadata": {"finalizers": ["a", "c"], "ownerReferences": [
                {"uid": "1", "name": "x2", "kind": "K", "apiVersion": "v1"},
                {"uid": "3", "name": "z", "kind": "K", "apiVersion": "v1"}]},
                "data": {"n": "bg=="}})
        );
        let t = json!({"metadata": {"finalizers": ["a"]}});
        let p = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        assert_eq!(
            patched(t, p),
            json!({"metadata": {}}),
            "an emptied list is left out"
        );
        let t = json!({"data": {"a": "1", "b": "2"}, "type": "Opaque"});
        let p =
            json!({"data": {"$retainKeys": ["b"], "b": "3"}, "stringData": {"$patch": "delete"}});
        assert_eq!(patched(t, p), json!({"data": {"b": "3"}, "type": "Opaque"}));
        // Other lists are replaced.
        let t = json!({"spec": {"xs": [1, 2]}});
        assert_eq!(
            patched(t, json!({"spec": {"xs": [3]}})),
            json!({"spec": {"xs": [3]}})
        );
    }

    #[test]
    fn long_merged_lists_merge_by_identity() {
        let n = 20_000;
        let refs: Vec<Value> = (0..n)
            .map(|i| json!({"uid": i.to_string(), "name": "o"}))
            .collect();
        let fins: Vec<Value> = (0..n).map(|i| json!(format!("f/{i}"))).collect();
        let mut t =
            json!({"metadata": {"ownerReferences": refs.clone(), "finalizers": fins.clone()}});
        let mut p_refs: Vec<Value> = refs
            .iter()
            .map(|r| json!({"uid": r["uid"], "$patch": "delete"}))
            .collect();
        p_refs.push(json!({"uid": "new", "name": "n"}));
        let p = json!({"metadata": {"ownerReferences": p_refs, "finalizers": fins}});
        apply(&mut t, &p).unwrap();
        assert_eq!(
            t["metadata"]["ownerReferences"],
            json!([{"uid": "new", "name": "n"}])
        );
        assert_eq!(t["metadata"]["finalizers"].as_array().unwrap().len(), n);
    }

    #[test]
    fn bad_patches_are_errors() {
        for p in [
            json!([1]),
            json!({"$patch": "explode"}),
            json!({"metadata": {"$frobnicate": 1}}),
            json!({"metadata": {"ownerReferences": [{"name": "no uid"}]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            json!({"data": {"$retainKeys": "a"}}),
        ] {
            let mut t = json!({"metadata": {"name": "s"}});
            assert!(apply(&mut t, &p).is_err(), "{p}");
        }
    }
}
