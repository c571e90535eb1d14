//! JSON patch (RFC 6902) on a JSON document: a patch's shape checked whole before
//! anything is applied ([`check_ops`]), then applied all or nothing ([`apply`]), every
//! error naming the operation and the path. The API's `PATCH` with
//! `application/json-patch+json` and the CLI's `patch --type json` both use it.

use serde_json::Value;

/// Most operations in one JSON patch.
pub const MAX_OPS: usize = 10_000;
/// Most bytes (as JSON text) all `copy` operations of one patch may add: each copy can
/// double a document, so a short patch of copies would otherwise grow one past any memory
/// (kube bounds the same, as `AccumulatedCopySizeLimit`).
pub const MAX_COPY_BYTES: usize = 3 << 20;

/// `v`'s kind in words, for messages (`a mapping`, `a list`, ...).
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Check a JSON patch's shape whole (every operation's `op`, `path`, `value` or
/// `from`) before anything is applied.
pub fn check_ops(p: &Value) -> Result<Vec<Value>, String> {
    let ops = p
        .as_array()
        .ok_or_else(|| format!("a json patch is a list of operations, not {}", kind_of(p)))?;
    if ops.len() > MAX_OPS {
        return Err(format!("the json patch has more than {MAX_OPS} operations"));
    }
    for (i, op) in ops.iter().enumerate() {
        let o = op
            .as_object()
            .ok_or_else(|| format!("json patch operation {i} is not a mapping"))?;
        let name = o
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("json patch operation {i} has no \"op\""))?;
        let path = o
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("json patch operation {i} ({name}) has no \"path\""))?;
        pointer_tokens(path).map_err(|e| format!("json patch operation {i} ({name}): {e}"))?;
        match name {
            "add" | "replace" | "test" => {
                if !o.contains_key("value") {
                    return Err(format!(
                        "json patch operation {i} ({name} {path}) has no \"value\""
                    ));
                }
            }
            "remove" => {}
            "move" | "copy" => {
                let from = o.get("from").and_then(Value::as_str).ok_or_else(|| {
                    format!("json patch operation {i} ({name} {path}) has no \"from\"")
                })?;
                pointer_tokens(from)
                    .map_err(|e| format!("json patch operation {i} ({name}): {e}"))?;
            }
            other => {
                return Err(format!(
                    "json patch operation {i} has unknown op {other:?} \
                     (expected add, remove, replace, move, copy or test)"
                ))
            }
        }
    }
    Ok(ops.clone())
}

/// A JSON pointer's (RFC 6901) reference tokens, unescaped.
fn pointer_tokens(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!(
            "path {p:?} is not a JSON pointer (it starts with /)"
        ));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn index(tok: &str, len: usize, path: &str, allow_end: bool) -> Result<usize, String> {
    if allow_end && tok == "-" {
        return Ok(len);
    }
    let ok = !tok.is_empty()
        && tok.bytes().all(|b| b.is_ascii_digit())
        && (tok == "0" || !tok.starts_with('0'));
    let i: usize = if ok { tok.parse().ok() } else { None }
        .ok_or_else(|| format!("{path}: {tok:?} is not an array index"))?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > max || (!allow_end && len == 0) {
        return Err(format!("{path}: index {i} is out of range (length {len})"));
    }
    Ok(i)
}

fn get_mut<'a>(doc: &'a mut Value, toks: &[String], path: &str) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| format!("{path}: {t:?} not found"))?,
            Value::Array(a) => {
                let i = index(t, a.len(), path, false)?;
                &mut a[i]
            }
            _ => {
                return Err(format!(
                    "{path}: {t:?} is below a value that is neither a mapping nor a list"
                ))
            }
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &str, v: Value) -> Result<(), String> {
    let toks = pointer_tokens(path)?;
    let Some((last, parent)) = toks.split_last() else {
        *doc = v;
        return Ok(());
    };
    match get_mut(doc, parent, path)? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
        }
        Value::Array(a) => {
            let i = index(last, a.len(), path, true)?;
            a.insert(i, v);
        }
        _ => {
            return Err(format!(
                "{path}: the parent is neither a mapping nor a list"
            ))
        }
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let toks = pointer_tokens(path)?;
    let Some((last, parent)) = toks.split_last() else {
        return Err("the whole document cannot be removed".into());
    };
    match get_mut(doc, parent, path)? {
        Value::Object(m) => m
            .shift_remove(last)
            .ok_or_else(|| format!("{path}: {last:?} not found")),
        Value::Array(a) => {
            let i = index(last, a.len(), path, false)?;
            Ok(a.remove(i))
        }
        _ => Err(format!(
            "{path}: the parent is neither a mapping nor a list"
        )),
    }
}

/// Apply a JSON patch (RFC 6902) to `doc`: all of it, or (on an error naming the
/// failing operation) none of it.
pub fn apply(doc: &mut Value, ops: &[Value]) -> Result<(), String> {
    let mut work = doc.clone();
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        let name = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        let from = op.get("from").and_then(Value::as_str).unwrap_or("");
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        let r = match name {
            "add" => add(&mut work, path, value),
            "remove" => remove(&mut work, path).map(|_| ()),
            "replace" => get_mut(&mut work, &pointer_tokens(path)?, path).map(|t| *t = value),
            "move" => {
                if path.starts_with(&format!("{from}/")) {
                    Err(format!("cannot move {from} into its own child {path}"))
                } else {
                    remove(&mut work, from).and_then(|v| add(&mut work, path, v))
                }
            }
            "copy" => get_mut(&mut work, &pointer_tokens(from)?, from)
                .and_then(|v| {
                    copied = copied.saturating_add(json_len(v, MAX_COPY_BYTES - copied + 1));
                    match copied > MAX_COPY_BYTES {
                        true => Err(format!(
                            "the copies of this patch add more than {MAX_COPY_BYTES} bytes"
                        )),
                        false => Ok(v.clone()),
                    }
                })
                .and_then(|v| add(&mut work, path, v)),
            "test" => get_mut(&mut work, &pointer_tokens(path)?, path).and_then(|t| {
                if *t == value {
                    Ok(())
                } else {
                    Err(format!("{path} is {t}, not {value}"))
                }
            }),
            other => Err(format!("unknown op {other:?}")),
        };
        r.map_err(|e| format!("json patch operation {i} ({name} {path}) failed: {e}"))?;
    }
    *doc = work;
    Ok(())
}

/// The length of `v` as JSON text, counted up to `cap` (no more is written).
fn json_len(v: &Value, cap: usize) -> usize {
    struct Count(usize, usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            match self.0 > self.1 {
                true => Err(std::io::ErrorKind::Other.into()),
                false => Ok(b.len()),
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0, cap);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn copies_that_double_the_document_are_bounded() {
        let mut doc = json!({"a": "x".repeat(1 << 16)});
        let before = doc.clone();
        // Each round copies 64 KiB twice: 40 rounds copy 5 MiB, past the bound.
        let ops: Vec<Value> = (0..40)
            .flat_map(|i| {
                [
                    json!({"op": "copy", "from": "/a", "path": format!("/b{i}")}),
                    json!({"op": "add", "path": "/a", "value": [{"op": "x"}]}),
                    json!({"op": "copy", "from": format!("/b{i}"), "path": "/a/0"}),
                ]
            })
            .collect();
        let ops = check_ops(&Value::Array(ops)).unwrap();
        let e = apply(&mut doc, &ops).unwrap_err();
        assert!(e.contains("more than 3145728 bytes"), "{e}");
        assert_eq!(doc, before, "nothing applied");
        // Small copies pass.
        let ok = check_ops(&json!([{"op": "copy", "from": "/a", "path": "/c"}])).unwrap();
        apply(&mut doc, &ok).unwrap();
        assert_eq!(doc["c"], doc["a"]);
        assert_eq!(json_len(&json!({"k": [1, 2]}), 100), 11);
        assert!(json_len(&doc, 10) <= 10 + (1 << 16) + 8);
    }
}
