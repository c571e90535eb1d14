//! Validation and defaulting from a CRD's `openAPIV3Schema`, as the Kubernetes API
//! server does for custom resources: types, `required`, `enum`, `pattern`, lengths
//! and bounds, `x-kubernetes-int-or-string`, defaults, unknown fields (rejected, as
//! with kubectl's strict field validation) and the CEL rules the reference CRDs use.
//!
//! Formats: `date-time` (RFC 3339) and the integer ranges of `int32`/`int64` are
//! checked here; `ip` (which kube itself does not check) is left to
//! [`super::constraints`], which covers every field that has it; `byte` occurs only in
//! `BMCSecret.data`, whose base64 the store checks as it does a Secret's. Any other
//! format is ignored.
//!
//! CEL is not implemented in general. The rule shapes that occur in the metal-operator
//! CRDs are recognised: `self == oldSelf` (immutable once set), `!has(oldSelf.F) ||
//! has(self.F)` (required once set), `has(self.A) != has(self.B)` (exactly one) and
//! `self.F.size() <= N`. Any other rule is ignored and reported by
//! [`Schema::unsupported_rules`] so that the omission is visible, not silent.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Schema {
    #[serde(rename = "type")]
    pub ty: Option<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, Schema>,
    #[serde(default)]
    pub required: Vec<String>,
    pub items: Option<Box<Schema>>,
    pub additional_properties: Option<AdditionalProperties>,
    #[serde(rename = "enum")]
    pub enum_values: Option<Vec<Value>>,
    pub default: Option<Value>,
    pub format: Option<String>,
    pub pattern: Option<String>,
    pub max_length: Option<u64>,
    pub min_length: Option<u64>,
    pub maximum: Option<f64>,
    pub minimum: Option<f64>,
    pub max_items: Option<u64>,
    pub min_items: Option<u64>,
    #[serde(default)]
    pub nullable: bool,
    #[serde(rename = "x-kubernetes-int-or-string", default)]
    pub int_or_string: bool,
    #[serde(rename = "x-kubernetes-preserve-unknown-fields", default)]
    pub preserve_unknown_fields: bool,
    #[serde(rename = "x-kubernetes-embedded-resource", default)]
    pub embedded_resource: bool,
    #[serde(rename = "x-kubernetes-validations", default)]
    pub validations: Vec<Rule>,
    #[serde(skip)]
    compiled_pattern: Option<regex::Regex>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum AdditionalProperties {
    Bool(bool),
    Schema(Box<Schema>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Rule {
    pub rule: String,
    #[serde(default)]
    pub message: Option<String>,
}

/// Why a field is invalid; mirrors Kubernetes' `metav1.CauseType` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Required,
    NotSupported,
    Invalid,
    TypeInvalid,
    Unknown,
    Forbidden,
    TooLong,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Required => "FieldValueRequired",
            Reason::NotSupported => "FieldValueNotSupported",
            Reason::Invalid => "FieldValueInvalid",
            Reason::TypeInvalid => "FieldValueTypeInvalid",
            Reason::Unknown => "FieldValueUnknown",
            Reason::Forbidden => "FieldValueForbidden",
            Reason::TooLong => "FieldValueTooLong",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub reason: Reason,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl Schema {
    /// Compile patterns once. Call after deserializing.
    pub(crate) fn prepare(&mut self) -> Result<(), String> {
        if let Some(p) = &self.pattern {
            self.compiled_pattern =
                Some(regex::Regex::new(p).map_err(|e| format!("bad pattern {p:?}: {e}"))?);
        }
        for s in self.properties.values_mut() {
            s.prepare()?;
        }
        if let Some(i) = &mut self.items {
            i.prepare()?;
        }
        if let Some(AdditionalProperties::Schema(s)) = &mut self.additional_properties {
            s.prepare()?;
        }
        Ok(())
    }

    /// Rules this validator does not understand (and therefore does not enforce).
    pub fn unsupported_rules(&self, path: &str, out: &mut Vec<String>) {
        for r in &self.validations {
            if parse_rule(&r.rule).is_none() {
                out.push(format!("{path}: {}", r.rule));
            }
        }
        for (k, s) in &self.properties {
            s.unsupported_rules(&format!("{path}.{k}"), out);
        }
        if let Some(i) = &self.items {
            i.unsupported_rules(&format!("{path}[]"), out);
        }
    }

    /// Fill in defaults, recursively, where a field is absent (kube applies defaults
    /// for properties of objects that are present).
    pub fn apply_defaults(&self, v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, s) in &self.properties {
                    if !map.contains_key(k) {
                        if let Some(d) = &s.default {
                            map.insert(k.clone(), d.clone());
                        }
                    }
                    if let Some(child) = map.get_mut(k) {
                        s.apply_defaults(child);
                    }
                }
                if let Some(AdditionalProperties::Schema(s)) = &self.additional_properties {
                    for (k, child) in map.iter_mut() {
                        if !self.properties.contains_key(k) {
                            s.apply_defaults(child);
                        }
                    }
                }
            }
            Value::Array(items) => {
                if let Some(s) = &self.items {
                    for it in items {
                        s.apply_defaults(it);
                    }
                }
            }
            _ => {}
        }
    }

    /// Validate `v` (at `path`) against this schema; `old` is the previous value for
    /// transition rules (absent on create).
    pub fn validate(&self, path: &str, v: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
        if v.is_null() {
            if self.nullable {
                return;
            }
            // kube drops nulls for absent optional fields; treat as absent.
            return;
        }
        if !self.check_type(path, v, errs) {
            return;
        }
        if let Some(allowed) = &self.enum_values {
            if !allowed.contains(v) {
                let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
                errs.push(FieldError {
                    field: path.into(),
                    reason: Reason::NotSupported,
                    message: format!(
                        "Unsupported value: {v}: supported values: {}",
                        list.join(", ")
                    ),
                });
            }
        }
        match v {
            Value::String(s) => {
                let n = s.chars().count() as u64;
                if let Some(m) = self.max_length {
                    if n > m {
                        errs.push(invalid(
                            path,
                            v,
                            &format!("must have at most {m} characters"),
                        ));
                    }
                }
                if let Some(m) = self.min_length {
                    if n < m {
                        errs.push(invalid(
                            path,
                            v,
                            &format!("must have at least {m} characters"),
                        ));
                    }
                }
                if let Some(re) = &self.compiled_pattern {
                    if !re.is_match(s) {
                        errs.push(invalid(path, v, &format!("should match '{}'", re.as_str())));
                    }
                }
                if self.format.as_deref() == Some("date-time")
                    && chrono::DateTime::parse_from_rfc3339(s).is_err()
                {
                    errs.push(invalid(path, v, "must be an RFC 3339 date-time"));
                }
            }
            Value::Number(num) => {
                let fits = match self.format.as_deref() {
                    Some("int32") => num.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
                    Some("int64") => num.as_i64().is_some(),
                    _ => true,
                };
                if !fits && (num.is_i64() || num.is_u64()) {
                    let f = self.format.as_deref().unwrap_or("");
                    errs.push(invalid(path, v, &format!("must fit in {f}")));
                }
                let f = num.as_f64().unwrap_or(0.0);
                if let Some(m) = self.maximum {
                    if f > m {
                        errs.push(invalid(
                            path,
                            v,
                            &format!("must be less than or equal to {m}"),
                        ));
                    }
                }
                if let Some(m) = self.minimum {
                    if f < m {
                        errs.push(invalid(
                            path,
                            v,
                            &format!("must be greater than or equal to {m}"),
                        ));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(m) = self.max_items {
                    if items.len() as u64 > m {
                        errs.push(invalid(
                            path,
                            &Value::from(items.len()),
                            &format!("must have at most {m} items"),
                        ));
                    }
                }
                if let Some(m) = self.min_items {
                    if (items.len() as u64) < m {
                        errs.push(invalid(
                            path,
                            &Value::from(items.len()),
                            &format!("must have at least {m} items"),
                        ));
                    }
                }
                if let Some(s) = &self.items {
                    for (i, it) in items.iter().enumerate() {
                        // Lists are not matched element-wise for transition rules.
                        s.validate(&format!("{path}[{i}]"), it, None, errs);
                    }
                }
            }
            Value::Object(map) => self.validate_object(path, map, old, errs),
            _ => {}
        }
        for r in &self.validations {
            if let Some(rule) = parse_rule(&r.rule) {
                if let Some(msg) = rule.check(v, old) {
                    errs.push(FieldError {
                        field: path.into(),
                        reason: Reason::Invalid,
                        message: r.message.clone().filter(|m| !m.is_empty()).unwrap_or(msg),
                    });
                }
            }
        }
    }

    /// The object part of [`Schema::validate`]: required properties, each property
    /// against its schema (`additionalProperties` for the unlisted ones), unknown ones
    /// refused unless the schema preserves them.
    fn validate_object(
        &self,
        path: &str,
        map: &serde_json::Map<String, Value>,
        old: Option<&Value>,
        errs: &mut Vec<FieldError>,
    ) {
        for r in &self.required {
            if map.get(r).is_none_or(|x| x.is_null()) {
                errs.push(FieldError {
                    field: join(path, r),
                    reason: Reason::Required,
                    message: "Required value".into(),
                });
            }
        }
        for (k, child) in map {
            // Object metadata is the API server's to validate (as in kube,
            // where CRD schemas cannot constrain it).
            if path.is_empty() && k == "metadata" {
                continue;
            }
            let cpath = join(path, k);
            let old_child = old.and_then(|o| o.get(k));
            if let Some(s) = self.properties.get(k) {
                s.validate(&cpath, child, old_child, errs);
            } else {
                match &self.additional_properties {
                    Some(AdditionalProperties::Schema(s)) => {
                        s.validate(&cpath, child, old_child, errs)
                    }
                    Some(AdditionalProperties::Bool(true)) => {}
                    _ if self.preserve_unknown_fields || self.embedded_resource => {}
                    _ => errs.push(FieldError {
                        field: cpath.clone(),
                        reason: Reason::Unknown,
                        message: format!("unknown field \"{cpath}\""),
                    }),
                }
            }
        }
    }

    fn check_type(&self, path: &str, v: &Value, errs: &mut Vec<FieldError>) -> bool {
        if self.int_or_string {
            if v.is_string() || v.is_i64() || v.is_u64() {
                return true;
            }
            errs.push(type_err(path, v, "integer or string"));
            return false;
        }
        let ok = match self.ty.as_deref() {
            None => true,
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("boolean") => v.is_boolean(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("number") => v.is_number(),
            Some(_) => true,
        };
        if !ok {
            errs.push(type_err(path, v, self.ty.as_deref().unwrap_or("?")));
        }
        ok
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn invalid(path: &str, v: &Value, why: &str) -> FieldError {
    FieldError {
        field: path.into(),
        reason: Reason::Invalid,
        message: format!("Invalid value: {v}: {why}"),
    }
}

fn type_err(path: &str, v: &Value, want: &str) -> FieldError {
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    FieldError {
        field: path.into(),
        reason: Reason::TypeInvalid,
        message: format!(
            "Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
        ),
    }
}

/// The CEL rule shapes we understand.
#[derive(Debug, PartialEq)]
enum CelRule {
    Immutable,
    RequiredOnceSet(String),
    ExactlyOne(String, String),
    MaxSize(String, usize),
}

fn parse_rule(rule: &str) -> Option<CelRule> {
    let r: String = rule.split_whitespace().collect::<Vec<_>>().join(" ");
    if r == "self == oldSelf" {
        return Some(CelRule::Immutable);
    }
    if let Some(rest) = r.strip_prefix("!has(oldSelf.") {
        let (f, tail) = rest.split_once(')')?;
        if tail == format!(" || has(self.{f})") {
            return Some(CelRule::RequiredOnceSet(f.to_string()));
        }
    }
    if let Some(rest) = r.strip_prefix("has(self.") {
        let (a, tail) = rest.split_once(')')?;
        let b = tail.strip_prefix(" != has(self.")?.strip_suffix(')')?;
        return Some(CelRule::ExactlyOne(a.to_string(), b.to_string()));
    }
    if let Some(rest) = r.strip_prefix("self.") {
        let (f, tail) = rest.split_once(".size() <= ")?;
        return Some(CelRule::MaxSize(f.to_string(), tail.trim().parse().ok()?));
    }
    None
}

impl CelRule {
    /// `Some(message)` when violated.
    fn check(&self, v: &Value, old: Option<&Value>) -> Option<String> {
        match self {
            CelRule::Immutable => match old {
                Some(o) if o != v => Some("field is immutable".into()),
                _ => None,
            },
            CelRule::RequiredOnceSet(f) => match old {
                Some(o) if o.get(f).is_some() && v.get(f).is_none() => {
                    Some(format!("{f} is required once set"))
                }
                _ => None,
            },
            CelRule::ExactlyOne(a, b) => {
                if v.get(a).is_some() != v.get(b).is_some() {
                    None
                } else {
                    Some(format!("exactly one of {a} and {b} must be set"))
                }
            }
            CelRule::MaxSize(f, n) => match v.get(f).and_then(|x| x.as_str()) {
                Some(s) if s.chars().count() > *n => {
                    Some(format!("{f} must be at most {n} characters"))
                }
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        let mut s: Schema = serde_json::from_value(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["image"],
                    "x-kubernetes-validations": [
                        {"rule": "!has(oldSelf.serverRef) || has(self.serverRef)", "message": "serverRef is required once set"}
                    ],
                    "properties": {
                        "image": {"type": "string"},
                        "power": {"type": "string", "enum": ["On", "Off"]},
                        "policy": {"type": "string", "default": "Recycle"},
                        "serverRef": {"type": "object", "properties": {"name": {"type": "string"}},
                                      "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "serverRef is immutable"}]},
                        "uuid": {"type": "string", "pattern": "^[0-9a-f-]+$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "cap": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true}
                    }
                }
            }
        }))
        .unwrap();
        s.prepare().unwrap();
        s
    }

    fn errs(v: Value, old: Option<Value>) -> Vec<FieldError> {
        let mut e = Vec::new();
        schema().validate("", &v, old.as_ref(), &mut e);
        e
    }

    #[test]
    fn accepts_valid() {
        assert!(errs(
            json!({"spec": {"image": "x", "power": "On", "labels": {"a": "b"}, "cap": "10Gi"}}),
            None
        )
        .is_empty());
    }

    #[test]
    fn names_each_problem() {
        let e = errs(
            json!({"spec": {"power": "Maybe", "bogus": 1, "uuid": "XYZ", "cap": 1.5}}),
            None,
        );
        let fields: Vec<_> = e.iter().map(|e| (e.field.as_str(), e.reason)).collect();
        assert!(fields.contains(&("spec.image", Reason::Required)), "{e:?}");
        assert!(
            fields.contains(&("spec.power", Reason::NotSupported)),
            "{e:?}"
        );
        assert!(fields.contains(&("spec.bogus", Reason::Unknown)), "{e:?}");
        assert!(fields.contains(&("spec.uuid", Reason::Invalid)), "{e:?}");
        assert!(fields.contains(&("spec.cap", Reason::TypeInvalid)), "{e:?}");
        assert!(e.iter().any(|e| e.message.contains("\"On\"")));
    }

    #[test]
    fn transition_rules() {
        let old = json!({"spec": {"image": "x", "serverRef": {"name": "a"}}});
        let e = errs(
            json!({"spec": {"image": "x", "serverRef": {"name": "b"}}}),
            Some(old.clone()),
        );
        assert_eq!(e[0].message, "serverRef is immutable");
        let e = errs(json!({"spec": {"image": "x"}}), Some(old.clone()));
        assert_eq!(e[0].message, "serverRef is required once set");
        assert!(errs(old.clone(), Some(old)).is_empty());
    }

    #[test]
    fn integer_formats_are_ranges() {
        let mut s: Schema = serde_json::from_value(json!({"type": "object", "properties": {
            "a": {"type": "integer", "format": "int32"},
            "b": {"type": "integer", "format": "int64"}}}))
        .unwrap();
        s.prepare().unwrap();
        let check = |v: Value| {
            let mut e = Vec::new();
            s.validate("", &v, None, &mut e);
            e.into_iter().map(|e| e.field).collect::<Vec<_>>()
        };
        assert!(check(json!({"a": i32::MAX, "b": i64::MIN})).is_empty());
        assert_eq!(check(json!({"a": 1u64 << 31, "b": u64::MAX})), ["a", "b"]);
        assert_eq!(check(json!({"a": -(1i64 << 31) - 1})), ["a"]);
    }

    #[test]
    fn defaults_fill_absent_fields() {
        let mut v = json!({"spec": {"image": "x"}});
        schema().apply_defaults(&mut v);
        assert_eq!(v["spec"]["policy"], "Recycle");
    }

    #[test]
    fn parses_reference_rule_shapes() {
        assert_eq!(parse_rule("self == oldSelf"), Some(CelRule::Immutable));
        assert_eq!(
            parse_rule("has(self.access) != has(self.endpointRef)"),
            Some(CelRule::ExactlyOne("access".into(), "endpointRef".into()))
        );
        assert_eq!(
            parse_rule("self.key.size() <= 253"),
            Some(CelRule::MaxSize("key".into(), 253))
        );
        assert_eq!(parse_rule("self.x.startsWith('a')"), None);
    }
}
