//! What `kubectl get` prints of an object, shared by the API's server-side tables
//! (`Accept: ...;as=Table;g=meta.k8s.io`) and the CLI's own tables: the JSONPath subset
//! printer columns use, a column's cell as the apiserver types it, and ages the way
//! kube's `HumanDuration` writes them.
//!
//! The JSONPath subset is what the embedded CRDs' `additionalPrinterColumns` and
//! bootplane's own columns need: `.a.b`, `.list[0]`, `.list[?(@.k=="v")].f`.

use serde_json::Value;

use super::registry::PrinterColumn;

/// Evaluate the JSONPath subset against `v`: the first match, or `None`.
pub fn jsonpath<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    let mut rest = path.trim_start_matches('.');
    while !rest.is_empty() {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let (field, tail) = rest.split_at(end);
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        rest = tail;
        if let Some(t) = rest.strip_prefix('[') {
            let close = t.find(']')?;
            let inner = &t[..close];
            rest = &t[close + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|e| e.get(k.trim()).and_then(Value::as_str) == Some(want))?;
            } else {
                cur = cur.get(inner.parse::<usize>().ok()?)?;
            }
        }
        rest = rest.trim_start_matches('.');
    }
    Some(cur)
}

/// The cell of column `c` for object `o`, as the apiserver's CRD table convertor types
/// it: `null` when the path finds nothing (kubectl prints `<none>`), a `date` column as
/// an age relative to `now_unix` (`5m10s`), numbers and booleans as themselves where the
/// column says so, everything else as text.
pub fn cell(c: &PrinterColumn, o: &Value, now_unix: i64) -> Value {
    let Some(v) = jsonpath(o, &c.json_path).filter(|v| !v.is_null()) else {
        return Value::Null;
    };
    match (c.kind.as_str(), v) {
        ("date", Value::String(s)) => match chrono::DateTime::parse_from_rfc3339(s) {
            Ok(t) => Value::String(human_duration(now_unix - t.timestamp())),
            Err(_) => Value::String("<invalid>".into()),
        },
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => v.clone(),
        ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => v.clone(),
        (_, Value::String(s)) => Value::String(s.clone()),
        (_, other) => Value::String(other.to_string()),
    }
}

/// A duration in seconds as kube's `duration.HumanDuration` writes it (`45s`, `5m10s`,
/// `3h`, `2d4h`, `1y30d`); negative beyond a second of clock skew is `<invalid>`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let (m, h) = (s / 60, s / 3600);
    let with = |big: i64, unit: &str, small: i64, sub: &str| match small {
        0 => format!("{big}{unit}"),
        n => format!("{big}{unit}{n}{sub}"),
    };
    match h {
        _ if m < 10 => with(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        0..8 => with(h, "h", m % 60, "m"),
        8..48 => format!("{h}h"),
        48..192 => with(h / 24, "d", h % 24, "h"),
        _ if h < 24 * 365 * 2 => format!("{}d", h / 24),
        _ if h < 24 * 365 * 8 => with(h / 24 / 365, "y", (h / 24) % 365, "d"),
        _ => format!("{}y", h / 24 / 365),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_fields_indexes_and_filters() {
        let v = json!({"status": {"conditions": [{"type": "A", "t": 1}, {"type": "B", "t": 2}]},
                       "l": [5]});
        assert_eq!(
            jsonpath(&v, ".status.conditions[?(@.type==\"B\")].t"),
            Some(&json!(2))
        );
        assert_eq!(jsonpath(&v, ".l[0]"), Some(&json!(5)));
        assert_eq!(jsonpath(&v, ".status.missing"), None);
        assert_eq!(jsonpath(&v, ".l[x]"), None);
    }

    #[test]
    fn ages_as_kube_writes_them() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (310, "5m10s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (52 * 3600, "2d4h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (760 * 86400, "2y30d"),
            (3000 * 86400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn cells_typed_as_the_column_says() {
        let col = |kind: &str, path: &str| PrinterColumn {
            name: "X".into(),
            kind: kind.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: path.into(),
        };
        let o = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
                       "spec": {"n": 3, "b": true, "s": "x", "m": {"k": 1}, "z": null}});
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .timestamp();
        let date = col("date", ".metadata.creationTimestamp");
        assert_eq!(cell(&date, &o, t0 + 310), json!("5m10s"));
        assert_eq!(cell(&col("integer", ".spec.n"), &o, 0), json!(3));
        assert_eq!(cell(&col("boolean", ".spec.b"), &o, 0), json!(true));
        assert_eq!(cell(&col("string", ".spec.n"), &o, 0), json!("3"));
        assert_eq!(cell(&col("string", ".spec.m"), &o, 0), json!("{\"k\":1}"));
        assert_eq!(cell(&col("string", ".spec.z"), &o, 0), Value::Null);
        assert_eq!(cell(&col("string", ".spec.none"), &o, 0), Value::Null);
        assert_eq!(cell(&col("date", ".spec.s"), &o, 0), json!("<invalid>"));
    }
}
