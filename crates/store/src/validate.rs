//! Validation of objects before they are written: the identity fields every object
//! has (apiVersion, kind, name, namespace, labels, annotations), the type's schema
//! (with its defaults applied), the constraints bootplane adds to the reference CRDs
//! (`model::constraints`: enums such as `status.state`, UUID/MAC/IP formats), and the
//! built-in types' own rules (Secrets). Every write goes through [`check`]: create,
//! update of either part, `update_status`, merge patch.

use serde_json::{Map, Value};

use super::{Result, StoreError};
use bootplane_model::registry::ResourceType;
use bootplane_model::schema::{FieldError, Reason};
use bootplane_model::{constraints, labels};

pub(super) fn err_invalid(rt: &ResourceType, name: &str, causes: Vec<FieldError>) -> StoreError {
    StoreError::Invalid {
        kind: rt.kind.clone(),
        name: name.to_string(),
        causes,
    }
}

pub(super) fn field(f: &str, reason: Reason, message: impl Into<String>) -> FieldError {
    FieldError {
        field: f.into(),
        reason,
        message: message.into(),
    }
}

/// Normalise and validate an object for `rt`; `old` is the stored object on update.
pub(super) fn check(rt: &ResourceType, obj: &mut Value, old: Option<&Value>) -> Result<()> {
    let Value::Object(map) = obj else {
        return Err(StoreError::BadRequest(
            "object must be a JSON/YAML mapping".into(),
        ));
    };
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == rt.api_version() => {}
        Some(v) => {
            return Err(StoreError::BadRequest(format!(
                "apiVersion {v:?} does not match {} for kind {}",
                rt.api_version(),
                rt.kind
            )))
        }
        None => {
            map.insert("apiVersion".into(), Value::String(rt.api_version()));
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if k == rt.kind => {}
        Some(k) => {
            return Err(StoreError::BadRequest(format!(
                "kind {k:?} does not match {}",
                rt.kind
            )))
        }
        None => {
            map.insert("kind".into(), Value::String(rt.kind.clone()));
        }
    }
    let mut causes = Vec::new();
    match map.get_mut("metadata") {
        Some(Value::Object(m)) => {
            if !bootplane_model::meta::valid_object_name(&name) {
                causes.push(field(
                    "metadata.name",
                    if name.is_empty() { Reason::Required } else { Reason::Invalid },
                    if name.is_empty() {
                        "Required value: name is required".to_string()
                    } else {
                        format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
                    },
                ));
            }
            if rt.namespaced {
                let ns = m
                    .get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string();
                if !bootplane_model::meta::valid_object_name(&ns) {
                    causes.push(field(
                        "metadata.namespace",
                        Reason::Invalid,
                        format!("Invalid value: {ns:?}"),
                    ));
                }
                m.insert("namespace".into(), Value::String(ns));
            } else {
                m.remove("namespace");
            }
            for f in ["labels", "annotations"] {
                match m.get(f) {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(l)) => {
                        for (k, v) in l {
                            if !v.is_string() {
                                causes.push(field(
                                    &format!("metadata.{f}.{k}"),
                                    Reason::TypeInvalid,
                                    "must be a string",
                                ));
                            }
                        }
                        // Syntax and size (Kubernetes' rules). Unchanged on an
                        // update, they are not checked again: an object stored
                        // before these rules keeps taking status writes.
                        let old_l = old.and_then(|o| o.pointer(&format!("/metadata/{f}")));
                        if old_l.and_then(Value::as_object) != Some(l) {
                            if f == "labels" {
                                labels::check_labels(l, &mut causes);
                            } else {
                                labels::check_annotations(l, &mut causes);
                            }
                        }
                    }
                    Some(_) => causes.push(field(
                        &format!("metadata.{f}"),
                        Reason::TypeInvalid,
                        "must be a map of strings",
                    )),
                }
            }
        }
        _ => causes.push(field("metadata", Reason::Required, "Required value")),
    }
    if (rt.kind == "Secret" && rt.group.is_empty())
        || (rt.kind == "BMCSecret" && rt.group == "metal.ironcore.dev")
    {
        check_secret(map, &mut causes);
    }
    if rt.kind == "APIToken" && rt.group == "auth.bootplane.dev" {
        check_api_token(map, &mut causes);
    }
    if rt.kind == "Event" && rt.group.is_empty() {
        check_event(map, &mut causes);
    }
    if let Some(schema) = &rt.schema {
        schema.apply_defaults(obj);
        schema.validate("", obj, old, &mut causes);
    }
    // What the CRDs leave out (enums, UUID/MAC/IP formats), values an update leaves
    // unchanged excepted (`model::constraints`).
    constraints::check(&rt.group, &rt.kind, obj, old, &mut causes);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(err_invalid(rt, &name, causes))
    }
}

/// A core/v1 `Event` (`store::events`): `involvedObject.kind` and `.name`, `reason`
/// (at most 128 characters), `message` (at most 1 KiB), `type` Normal or Warning,
/// `count` a positive integer, timestamps RFC 3339.
fn check_event(map: &Map<String, Value>, causes: &mut Vec<FieldError>) {
    use super::events::{MAX_MESSAGE, MAX_REASON};
    let s = |k: &str| map.get(k).and_then(Value::as_str);
    for k in ["kind", "name"] {
        if map
            .get("involvedObject")
            .and_then(|o| o.get(k))
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(field(
                &format!("involvedObject.{k}"),
                Reason::Required,
                "Required value",
            ));
        }
    }
    if s("reason").is_some_and(|r| r.len() > MAX_REASON) {
        causes.push(field(
            "reason",
            Reason::Invalid,
            format!("must be at most {MAX_REASON} characters"),
        ));
    }
    if s("message").is_some_and(|m| m.len() > MAX_MESSAGE) {
        causes.push(field(
            "message",
            Reason::Invalid,
            format!("must be at most {MAX_MESSAGE} bytes"),
        ));
    }
    if let Some(t) = map.get("type") {
        if !matches!(t.as_str(), Some("Normal" | "Warning")) {
            causes.push(field(
                "type",
                Reason::NotSupported,
                "supported values: \"Normal\", \"Warning\"",
            ));
        }
    }
    if let Some(c) = map.get("count") {
        if c.as_u64().is_none_or(|c| c < 1) {
            causes.push(field(
                "count",
                Reason::Invalid,
                "must be a positive integer",
            ));
        }
    }
    for k in ["firstTimestamp", "lastTimestamp", "eventTime"] {
        if let Some(t) = map.get(k).filter(|t| !t.is_null()) {
            if t.as_str()
                .is_none_or(|t| chrono::DateTime::parse_from_rfc3339(t).is_err())
            {
                causes.push(field(k, Reason::Invalid, "must be an RFC 3339 time"));
            }
        }
    }
}

/// An `APIToken` (`api::auth`): `spec.role`, `spec.secretHash` (`sha256:` + 64 hex
/// digits), optional `spec.expiresAt` (RFC 3339); nothing else.
fn check_api_token(map: &Map<String, Value>, causes: &mut Vec<FieldError>) {
    for k in map.keys() {
        if !["apiVersion", "kind", "metadata", "spec"].contains(&k.as_str()) {
            causes.push(field(k, Reason::Unknown, format!("unknown field \"{k}\"")));
        }
    }
    let Some(Value::Object(spec)) = map.get("spec") else {
        causes.push(field("spec", Reason::Required, "Required value"));
        return;
    };
    for k in spec.keys() {
        if !["role", "secretHash", "expiresAt"].contains(&k.as_str()) {
            causes.push(field(
                &format!("spec.{k}"),
                Reason::Unknown,
                format!("unknown field \"{k}\""),
            ));
        }
    }
    if spec
        .get("role")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        causes.push(field("spec.role", Reason::Required, "Required value"));
    }
    let hash_ok = spec
        .get("secretHash")
        .and_then(Value::as_str)
        .and_then(|h| h.strip_prefix("sha256:"))
        .is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        });
    if !hash_ok {
        causes.push(field(
            "spec.secretHash",
            Reason::Invalid,
            "must be sha256: and 64 lower-case hex digits",
        ));
    }
    match spec.get("expiresAt") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if chrono::DateTime::parse_from_rfc3339(t).is_ok() => {}
        Some(_) => causes.push(field(
            "spec.expiresAt",
            Reason::Invalid,
            "must be an RFC 3339 time",
        )),
    }
}

fn check_secret(map: &mut Map<String, Value>, causes: &mut Vec<FieldError>) {
    use base64::Engine;
    const ALLOWED: &[&str] = &[
        "apiVersion",
        "kind",
        "metadata",
        "data",
        "stringData",
        "type",
        "immutable",
    ];
    for k in map.keys() {
        if !ALLOWED.contains(&k.as_str()) {
            causes.push(field(k, Reason::Unknown, format!("unknown field \"{k}\"")));
        }
    }
    if let Some(Value::Object(sd)) = map.remove("stringData") {
        let data = map
            .entry("data")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(d) = data {
            for (k, v) in sd {
                match v {
                    Value::String(s) => {
                        d.insert(
                            k,
                            Value::String(base64::engine::general_purpose::STANDARD.encode(s)),
                        );
                    }
                    _ => causes.push(field(
                        &format!("stringData.{k}"),
                        Reason::TypeInvalid,
                        "must be a string",
                    )),
                }
            }
        }
    }
    match map.get("data") {
        None | Some(Value::Null) => {}
        Some(Value::Object(d)) => {
            for (k, v) in d {
                match v.as_str() {
                    Some(s) => {
                        if let Err(e) = base64::engine::general_purpose::STANDARD.decode(s) {
                            causes.push(field(
                                &format!("data.{k}"),
                                Reason::Invalid,
                                format!("illegal base64 data: {e}"),
                            ));
                        }
                    }
                    None => causes.push(field(
                        &format!("data.{k}"),
                        Reason::TypeInvalid,
                        "must be a base64 string",
                    )),
                }
                if k.is_empty()
                    || !k
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
                {
                    causes.push(field(&format!("data.{k}"), Reason::Invalid, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"));
                }
            }
        }
        Some(_) => causes.push(field(
            "data",
            Reason::TypeInvalid,
            "must be a map of base64 strings",
        )),
    }
    if !map.contains_key("type") {
        map.insert("type".into(), Value::String("Opaque".into()));
    }
}
