//! Merging two Ignition configs in-process, with Ignition's merge rules (the ones it
//! applies for `ignition.config.merge`): objects merge field by field, the child's
//! scalars win; keyed lists merge entry by entry on their key (files/directories/links
//! by `path`, units/drop-ins/users/groups/raid/luks by `name`, disks/filesystems by
//! `device`, partitions by `number` then `label`, CAs by `source`, headers by `name`),
//! other entries are appended in order; lists of strings (ssh keys, groups, kernel
//! arguments, options) are unioned in order. `ignition.version` becomes the newer of
//! the two (every 3.x version is a superset of the ones before).

use serde_json::{Map, Value};

/// The identity key of the entries of the list at `key` (given the parent object key).
fn list_key(key: &str) -> Option<&'static [&'static str]> {
    Some(match key {
        "files" | "directories" | "links" => &["path"],
        "units" | "dropins" | "users" | "groups" | "raid" | "luks" | "httpHeaders" => &["name"],
        "disks" | "filesystems" => &["device"],
        "partitions" => &["number", "label"],
        "certificateAuthorities" => &["source"],
        "tang" => &["url"],
        _ => return None,
    })
}

/// Merges `child` onto `parent` and returns the result.
pub(crate) fn merge(parent: &Value, child: &Value) -> Value {
    let mut out = parent.clone();
    merge_into(&mut out, child, "");
    if let (Some(a), Some(b)) = (
        parent.pointer("/ignition/version").and_then(Value::as_str),
        child.pointer("/ignition/version").and_then(Value::as_str),
    ) {
        let newer = match (super::IgnVersion::parse(a), super::IgnVersion::parse(b)) {
            (Some(x), Some(y)) if x > y => a,
            _ => b,
        };
        if let Some(ign) = out.get_mut("ignition").and_then(Value::as_object_mut) {
            ign.insert("version".into(), Value::String(newer.to_string()));
        }
    }
    out
}

fn merge_into(dst: &mut Value, src: &Value, key: &str) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => merge_obj(d, s),
        (Value::Array(d), Value::Array(s)) => merge_list(d, s, key),
        (d, s) => *d = s.clone(),
    }
}

fn merge_obj(d: &mut Map<String, Value>, s: &Map<String, Value>) {
    for (k, v) in s {
        match d.get_mut(k) {
            Some(existing) if !v.is_null() => merge_into(existing, v, k),
            Some(existing) => *existing = Value::Null,
            None => {
                d.insert(k.clone(), v.clone());
            }
        }
    }
}

fn identity(e: &Value, keys: &'static [&'static str]) -> Option<(&'static str, String)> {
    let o = e.as_object()?;
    for k in keys {
        match o.get(*k) {
            Some(Value::String(s)) if !s.is_empty() => return Some((*k, s.clone())),
            Some(Value::Number(n)) if n.as_i64() != Some(0) => return Some((*k, n.to_string())),
            _ => {}
        }
    }
    None
}

fn merge_list(d: &mut Vec<Value>, s: &[Value], key: &str) {
    if s.iter().all(|x| !x.is_object() && !x.is_array())
        && d.iter().all(|x| !x.is_object() && !x.is_array())
    {
        for x in s {
            if !d.contains(x) {
                d.push(x.clone());
            }
        }
        return;
    }
    let Some(keys) = list_key(key) else {
        d.extend(s.iter().cloned());
        return;
    };
    // Only the parent's entries are merge targets: duplicates inside the child stay
    // duplicates, so validation still reports them (Ignition rejects them too).
    let parent_len = d.len();
    for x in s {
        let id = identity(x, keys);
        let pos = id.as_ref().and_then(|id| {
            d[..parent_len]
                .iter()
                .position(|y| identity(y, keys).as_ref() == Some(id))
        });
        match pos {
            Some(p) => merge_into(&mut d[p], x, ""),
            None => d.push(x.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keyed_lists_merge_and_child_wins() {
        let parent = json!({"ignition": {"version": "3.3.0"},
            "storage": {"files": [{"path": "/etc/hostname", "mode": 420, "contents": {"source": "data:,a"}}, {"path": "/keep"}]},
            "systemd": {"units": [{"name": "a.service", "enabled": true}]},
            "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k1"]}]}});
        let child = json!({"ignition": {"version": "3.4.0"},
            "storage": {"files": [{"path": "/etc/hostname", "contents": {"source": "data:,b"}}, {"path": "/new"}]},
            "systemd": {"units": [{"name": "a.service", "mask": true}, {"name": "b.service"}]},
            "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k1", "k2"]}]}});
        let m = merge(&parent, &child);
        assert_eq!(m["ignition"]["version"], "3.4.0");
        assert_eq!(
            m["storage"]["files"][0],
            json!({"path": "/etc/hostname", "mode": 420, "contents": {"source": "data:,b"}})
        );
        assert_eq!(m["storage"]["files"].as_array().unwrap().len(), 3);
        assert_eq!(
            m["systemd"]["units"][0],
            json!({"name": "a.service", "enabled": true, "mask": true})
        );
        assert_eq!(
            m["passwd"]["users"][0]["sshAuthorizedKeys"],
            json!(["k1", "k2"])
        );
    }

    #[test]
    fn older_child_keeps_newer_version() {
        let m = merge(
            &json!({"ignition": {"version": "3.5.0"}}),
            &json!({"ignition": {"version": "3.2.0"}}),
        );
        assert_eq!(m["ignition"]["version"], "3.5.0");
    }
}
