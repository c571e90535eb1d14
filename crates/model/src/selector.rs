//! Label selectors: the `-l`/`labelSelector=` string syntax (`a=b,c!=d,e in (x,y),
//! f notin (z),g,!h`) and the `LabelSelector` object (`matchLabels`,
//! `matchExpressions` with In/NotIn/Exists/DoesNotExist) used by ServerClaims; and
//! field selectors (`fieldSelector=involvedObject.name=s1,type!=Normal`): equality on
//! dotted paths to string values, as Kubernetes offers them.

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

/// A field selector: `path=value`, `path==value`, `path!=value`, comma-separated, on
/// dotted paths (`metadata.name`, `involvedObject.kind`). A missing field reads as "".
/// At most [`FieldSelector::MAX_TERMS`] terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    terms: Vec<(Vec<String>, bool, String)>,
}

impl FieldSelector {
    pub(crate) const MAX_TERMS: usize = 16;

    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid field selector term {p:?}: expected path=value or path!=value"
                ));
            };
            let k = k.trim();
            if k.is_empty()
                || k.split('.').any(|seg| {
                    seg.is_empty() || !seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
            {
                return Err(format!("invalid field path {k:?} in field selector"));
            }
            terms.push((
                k.split('.').map(str::to_string).collect(),
                eq,
                v.trim().to_string(),
            ));
            if terms.len() > Self::MAX_TERMS {
                return Err(format!(
                    "a field selector has at most {} terms",
                    Self::MAX_TERMS
                ));
            }
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(path, eq, want)| {
            let mut v = obj;
            for seg in path {
                match v.get(seg) {
                    Some(x) => v = x,
                    None => return (want.is_empty()) == *eq,
                }
            }
            let got = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ => return !*eq,
            };
            (got == *want) == *eq
        })
    }
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
    fn field_selectors() {
        let o = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Server", "name": "s1"}, "count": 3});
        assert!(
            FieldSelector::parse("involvedObject.kind=Server,involvedObject.name==s1")
                .unwrap()
                .matches(&o)
        );
        assert!(!FieldSelector::parse("involvedObject.name!=s1")
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("metadata.namespace=")
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("count=3").unwrap().matches(&o));
        assert!(!FieldSelector::parse("involvedObject=x")
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("a..b=1").is_err());
        assert!(FieldSelector::parse("noequals").is_err());
        assert!(FieldSelector::parse(&"a=1,".repeat(17)).is_err());
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
