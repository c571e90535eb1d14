//! Fuzz the API's request bodies: bytes → `bodies::body_format` + the bounded
//! `decode::decode` that `bodies::decode_body` runs (JSON, YAML, or no Content-Type,
//! picked by the first byte) → what the store does with an object of a
//! registered kind (schema defaults + validation against the embedded CRDs), a
//! ServerClaim's `spec.serverSelector` as the claim controller reads it, and the body
//! as a JSON merge patch on a stored Server (applying it twice = once). Any panic is a
//! bug.
#![no_main]

use bootplane::model::registry::Registry;
use bootplane::api::bodies::body_format;
use bootplane::decode::{decode, Limits};
use bootplane::model::selector::Selector;
use bootplane::store::merge_patch;
use http::{header, HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let mut h = HeaderMap::new();
    let ct = match sel % 4 {
        0 => Some("application/json"),
        1 => Some("application/yaml"),
        2 => Some("application/merge-patch+json"),
        _ => None,
    };
    if let Some(ct) = ct {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    let Ok(obj) = decode(body_format(&h), body, Limits::new(3 << 20)) else { return };
    assert!(obj.is_object(), "decode returns objects only");

    let reg = Registry::global();
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if let Some(rt) = reg.by_kind(api_version, kind) {
        if let Some(schema) = &rt.schema {
            let mut v = obj.clone();
            schema.apply_defaults(&mut v);
            let mut errs = Vec::new();
            schema.validate("", &v, None, &mut errs);
            let mut again = Vec::new();
            schema.validate("", &v, Some(&obj), &mut again);
        }
    }
    if let Some(s) = obj.pointer("/spec/serverSelector") {
        if let Ok(sel) = Selector::from_label_selector(s) {
            let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
            let _ = sel.matches(labels);
        }
    }

    let mut stored = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": "s1", "labels": {"rack": "a"}, "resourceVersion": "7"},
        "spec": {"uuid": "4c4c4544-0042-3510-8052-b4c04f4e4d32", "power": "Off"},
    });
    merge_patch(&mut stored, &obj);
    let once = stored.clone();
    merge_patch(&mut stored, &obj);
    assert_eq!(stored, once, "a merge patch applied twice differs from once");
});
