//! Label selectors: the `-l`/`labelSelector=` string syntax (`a=b,c!=d,e in (x,y),
//! f notin (z),g,!h`) and the `LabelSelector` object (`matchLabels`,
//! `matchExpressions` with In/NotIn/Exists/DoesNotExist) used by ServerClaims.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A conjunction of requirements. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    reqs: Vec<Req>,
}

impl Selector {
    /// Parse the string form.
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let r = if let Some(k) = p.strip_prefix('!') {
                Req::NotExists(key(k)?)
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Req::NotIn(key(k)?, set(rest)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Req::In(key(k)?, set(rest)?)
            } else if let Some((k, v)) = p.split_once("!=") {
                Req::NotEq(key(k)?, v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                Req::Eq(key(k)?, v.trim().to_string())
            } else {
                Req::Exists(key(p)?)
            };
            reqs.push(r);
        }
        Ok(Selector { reqs })
    }

    /// Build from a `LabelSelector` object.
    pub fn from_label_selector(v: &Value) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        if let Some(ml) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in ml {
                reqs.push(Req::Eq(
                    k.clone(),
                    val.as_str()
                        .ok_or("matchLabels values must be strings")?
                        .to_string(),
                ));
            }
        }
        if let Some(me) = v.get("matchExpressions").and_then(Value::as_array) {
            for e in me {
                let k = e
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or("matchExpressions[].key is required")?
                    .to_string();
                let vals: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Req::In(k, vals),
                    Some("NotIn") => Req::NotIn(k, vals),
                    Some("Exists") => Req::Exists(k),
                    Some("DoesNotExist") => Req::NotExists(k),
                    other => {
                        return Err(format!("unsupported matchExpressions operator {other:?}"))
                    }
                });
            }
        }
        Ok(Selector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    if k.is_empty() || k.contains(|c: char| c.is_whitespace() || "=!(),".contains(c)) {
        return Err(format!("invalid label key {k:?} in selector"));
    }
    Ok(k.to_string())
}

fn set(s: &str) -> Result<Vec<String>, String> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| format!("expected (values) in selector, got {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// Split a selector's string form into its requirements: on commas that are not
/// inside parentheses (`a in (x,y),b` is two). [`Selector::parse`] parses each part.
pub fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_form() {
        let l = json!({"a": "1", "b": "2"});
        let l = l.as_object();
        assert!(Selector::parse("a=1,b in (2,3),!c").unwrap().matches(l));
        assert!(!Selector::parse("a!=1").unwrap().matches(l));
        assert!(Selector::parse("b notin (3),a").unwrap().matches(l));
        assert!(Selector::parse("").unwrap().matches(None));
        assert!(Selector::parse("a in 1").is_err());
    }

    #[test]
    fn object_form() {
        let s = Selector::from_label_selector(&json!({"matchLabels": {"m": "Contoso"},
            "matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}))
        .unwrap();
        assert!(s.matches(json!({"m": "Contoso", "rack": "r1"}).as_object()));
        assert!(!s.matches(json!({"m": "Contoso"}).as_object()));
    }
}
