//! Kubernetes' rules for `metadata.labels` and `metadata.annotations` (apimachinery's
//! `ValidateLabels` / `ValidateAnnotations`): keys are qualified names (an optional
//! DNS-subdomain prefix and `/`, then a name of at most 63 characters), label values
//! are empty or name-like, and annotations total at most 256 KiB. Without them a
//! label could be `"../../x y"`, empty, hold newlines or 100 KB, and an object could
//! carry megabytes of annotations.

use serde_json::{Map, Value};

use super::schema::{FieldError, Reason};

/// Longest name part of a key, and longest label value.
pub(crate) const MAX_NAME_LEN: usize = 63;
/// Longest key prefix (a DNS subdomain).
pub(crate) const MAX_PREFIX_LEN: usize = 253;
/// Most bytes of annotations (keys and values) on one object, as Kubernetes.
pub(crate) const MAX_ANNOTATIONS_BYTES: usize = 256 << 10;

const NAME_RULE: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const VALUE_RULE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const PREFIX_RULE: &str = "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 bytes.
fn name_like(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 subdomain of at most 253 bytes.
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PREFIX_LEN
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Why `key` is not a qualified name, if it is not.
pub fn qualified_name_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((p, n)) => (Some(p), n),
    };
    if name.contains('/') {
        return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if p.len() > MAX_PREFIX_LEN {
            return Some(format!(
                "prefix part must be no more than {MAX_PREFIX_LEN} bytes"
            ));
        }
        if !dns_subdomain(p) {
            return Some(PREFIX_RULE.into());
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "name part must be no more than {MAX_NAME_LEN} bytes"
        ));
    }
    (!name_like(name)).then(|| NAME_RULE.into())
}

/// Why `value` is not a valid label value, if it is not.
pub fn label_value_error(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > MAX_NAME_LEN {
        return Some(format!("must be no more than {MAX_NAME_LEN} bytes"));
    }
    (!name_like(value)).then(|| VALUE_RULE.into())
}

/// A value as quoted in a message, cut short: messages must not echo 100 KB back.
fn shown(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return format!("{s:?}");
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &s[..end], s.len())
}

fn invalid(field: String, value: &str, why: String) -> FieldError {
    FieldError {
        field,
        reason: Reason::Invalid,
        message: format!("Invalid value: {}: {why}", shown(value)),
    }
}

/// Check `metadata.labels` (a map whose values are already known to be strings, or
/// reported otherwise): keys are qualified names, values label values.
pub fn check_labels(labels: &Map<String, Value>, causes: &mut Vec<FieldError>) {
    for (k, v) in labels {
        if let Some(why) = qualified_name_error(k) {
            causes.push(invalid("metadata.labels".into(), k, why));
        } else if let Some(why) = v.as_str().and_then(label_value_error) {
            causes.push(invalid(
                format!("metadata.labels.{k}"),
                v.as_str().unwrap_or(""),
                why,
            ));
        }
    }
}

/// Check `metadata.annotations`: keys are qualified names (case aside, as Kubernetes
/// lowercases them first), and keys and values total at most 256 KiB.
pub fn check_annotations(annotations: &Map<String, Value>, causes: &mut Vec<FieldError>) {
    let mut total = 0usize;
    for (k, v) in annotations {
        total = total
            .saturating_add(k.len())
            .saturating_add(v.as_str().map_or(0, str::len));
        if let Some(why) = qualified_name_error(&k.to_ascii_lowercase()) {
            causes.push(invalid("metadata.annotations".into(), k, why));
        }
    }
    if total > MAX_ANNOTATIONS_BYTES {
        causes.push(FieldError {
            field: "metadata.annotations".into(),
            reason: Reason::TooLong,
            message: format!(
                "Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes (has {total})"
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qualified_names() {
        for ok in [
            "a",
            "A-b_c.D",
            "bootplane.dev/rack",
            "kubernetes.io/hostname",
            "x.y-z.example/Name_1",
            &"n".repeat(63),
            &format!("{}/n", "p".repeat(253)),
        ] {
            assert_eq!(qualified_name_error(ok), None, "{ok}");
        }
        for bad in [
            "",
            "../../x y",
            "x y",
            "k\n",
            "-k",
            "k-",
            "a/b/c",
            "/k",
            "p/",
            "Example.COM/x",
            "ex..ample/x",
            "é",
            &"n".repeat(64),
            &format!("{}/n", "p".repeat(254)),
        ] {
            assert!(qualified_name_error(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "v", "r-1_a.b", &"x".repeat(63)] {
            assert_eq!(label_value_error(ok), None, "{ok}");
        }
        for bad in ["a\nb", "-v", "v.", "a b", "a/b", &"x".repeat(64)] {
            assert!(label_value_error(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn causes_name_the_field_and_do_not_echo_big_values() {
        let mut causes = Vec::new();
        let l = json!({"../../x y": "v", "k": "x".repeat(100 << 10), "ok": "fine"});
        check_labels(l.as_object().unwrap(), &mut causes);
        assert_eq!(causes.len(), 2, "{causes:?}");
        assert_eq!(causes[0].field, "metadata.labels");
        assert_eq!(causes[1].field, "metadata.labels.k");
        assert!(causes[1].message.len() < 200, "{}", causes[1].message);
        assert!(
            causes[1].message.contains("102400 bytes"),
            "{}",
            causes[1].message
        );
        let mut causes = Vec::new();
        let a = json!({"Example.com/Note": "any\nthing", "big": "x".repeat(256 << 10)});
        check_annotations(a.as_object().unwrap(), &mut causes);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].reason, Reason::TooLong);
        assert!(
            causes[0].message.contains("262144"),
            "{}",
            causes[0].message
        );
        let mut causes = Vec::new();
        let a = json!({"a b": "v"});
        check_annotations(a.as_object().unwrap(), &mut causes);
        assert_eq!(causes[0].field, "metadata.annotations");
    }
}
