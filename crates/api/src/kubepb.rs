//! kube's protobuf bodies (`application/vnd.kubernetes.protobuf`), what client-go's typed
//! clients send for built-in kinds (`kubectl create secret`, `kubectl auth can-i`): the
//! envelope (`k8s\0`, then a `runtime.Unknown` holding the kind and the object's bytes),
//! and the core `v1` Secret as the JSON object the rest of the API takes. Decoded with
//! `prost` from the fields of kube's `generated.proto` this needs; the answers stay JSON,
//! which those clients accept. Bounded by the body limit (prost reads nothing beyond
//! the bytes it is given). Other kinds are 415, naming what to send instead. Pure.

use std::collections::BTreeMap;

use axum::http::{header, HeaderMap, StatusCode};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use prost::Message as _;
use serde_json::{json, Map, Value};

use super::error::ApiError;

pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// What starts every protobuf-encoded kube object.
pub const MAGIC: &[u8] = b"k8s\0";

/// Whether a request's body is kube's protobuf.
pub fn is_protobuf(h: &HeaderMap) -> bool {
    (h.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with(MEDIA_TYPE))
}

/// `runtime.Unknown`: the envelope; `raw` holds the object.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    pub api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub kind: Option<String>,
}

/// `metav1.ObjectMeta`, the fields a client sets on a create or an update.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

/// `core/v1.Secret`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Secret {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    pub r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    pub string_data: BTreeMap<String, String>,
    #[prost(bool, optional, tag = "5")]
    pub immutable: Option<bool>,
}

/// Why a protobuf body was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PbError {
    /// Not kube's protobuf (400).
    #[error("protobuf body: {0}")]
    Malformed(String),
    /// A kind this module does not decode (415).
    #[error("protobuf bodies are read for v1 Secrets and the self reviews only (got {0}): send application/json or application/yaml")]
    Unsupported(String),
}

impl From<PbError> for ApiError {
    fn from(e: PbError) -> ApiError {
        match e {
            PbError::Malformed(_) => ApiError::bad_request(e.to_string()),
            PbError::Unsupported(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                e.to_string(),
            ),
        }
    }
}

fn bad(what: impl std::fmt::Display) -> PbError {
    PbError::Malformed(what.to_string())
}

/// The envelope's kind and the object's bytes.
pub fn open(body: &[u8]) -> Result<(TypeMeta, Vec<u8>), PbError> {
    let env = (body.strip_prefix(MAGIC)).ok_or_else(|| bad("no k8s envelope"))?;
    let unknown = Unknown::decode(env).map_err(bad)?;
    Ok((
        unknown.type_meta.unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    ))
}

/// The object in `body` as JSON: a `v1` Secret; any other kind is 415.
pub fn decode_object(body: &[u8]) -> Result<Value, PbError> {
    let (tm, raw) = open(body)?;
    let (api_version, kind) = (
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
    );
    if (api_version.as_str(), kind.as_str()) != ("v1", "Secret") {
        let shown: String = format!("{api_version} {kind}")
            .chars()
            .filter(|c| !c.is_control())
            .take(128)
            .collect();
        return Err(PbError::Unsupported(shown));
    }
    let s = Secret::decode(raw.as_slice()).map_err(bad)?;
    let mut o = Map::new();
    o.insert("apiVersion".into(), json!("v1"));
    o.insert("kind".into(), json!("Secret"));
    o.insert("metadata".into(), meta(s.metadata.unwrap_or_default()));
    if !s.data.is_empty() {
        let data: Map<String, Value> = (s.data.into_iter())
            .map(|(k, v)| (k, json!(STANDARD.encode(v))))
            .collect();
        o.insert("data".into(), Value::Object(data));
    }
    if !s.string_data.is_empty() {
        o.insert("stringData".into(), json!(s.string_data));
    }
    if let Some(t) = s.r#type {
        o.insert("type".into(), json!(t));
    }
    if let Some(i) = s.immutable {
        o.insert("immutable".into(), json!(i));
    }
    Ok(Value::Object(o))
}

fn meta(m: ObjectMeta) -> Value {
    let mut o = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            o.insert(k.into(), json!(v));
        }
    };
    put("name", m.name);
    put("generateName", m.generate_name);
    put("namespace", m.namespace);
    put("uid", m.uid);
    put("resourceVersion", m.resource_version);
    if !m.labels.is_empty() {
        o.insert("labels".into(), json!(m.labels));
    }
    if !m.annotations.is_empty() {
        o.insert("annotations".into(), json!(m.annotations));
    }
    if !m.finalizers.is_empty() {
        o.insert("finalizers".into(), json!(m.finalizers));
    }
    if !m.owner_references.is_empty() {
        let refs: Vec<Value> = (m.owner_references.into_iter())
            .map(|r| {
                let mut v = json!({"apiVersion": r.api_version.unwrap_or_default(),
                    "kind": r.kind.unwrap_or_default(), "name": r.name.unwrap_or_default(),
                    "uid": r.uid.unwrap_or_default()});
                if let Some(c) = r.controller {
                    v["controller"] = json!(c);
                }
                if let Some(b) = r.block_owner_deletion {
                    v["blockOwnerDeletion"] = json!(b);
                }
                v
            })
            .collect();
        o.insert("ownerReferences".into(), Value::Array(refs));
    }
    Value::Object(o)
}

/// `msg` in kube's envelope as `api_version` `kind` (tests and fuzz seeds).
pub fn encode(api_version: &str, kind: &str, msg: &impl prost::Message) -> Vec<u8> {
    let env = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(msg.encode_to_vec()),
    };
    [MAGIC, &env.encode_to_vec()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_as_kubectl_sends_it() {
        let s = Secret {
            metadata: Some(ObjectMeta {
                name: Some("s".into()),
                namespace: Some("default".into()),
                labels: [("a".to_string(), "b".to_string())].into(),
                finalizers: vec!["x/y".into()],
                ..Default::default()
            }),
            data: [("k".to_string(), b"\x00v\xff".to_vec())].into(),
            r#type: Some("Opaque".into()),
            string_data: [("t".to_string(), "u".to_string())].into(),
            immutable: Some(true),
        };
        let v = decode_object(&encode("v1", "Secret", &s)).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "namespace": "default", "labels": {"a": "b"}, "finalizers": ["x/y"]},
                "data": {"k": "AHb/"}, "stringData": {"t": "u"}, "type": "Opaque", "immutable": true})
        );
    }

    #[test]
    fn other_kinds_and_bad_bytes_are_refused() {
        let cm = encode("v1", "ConfigMap", &Secret::default());
        let e = ApiError::from(decode_object(&cm).unwrap_err());
        assert_eq!(e.code, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        for bad in [&b"{}"[..], b"k8s\0\xff\xff", b"k8s\0\x12\x05ab"] {
            let e = ApiError::from(decode_object(bad).unwrap_err());
            assert_eq!(e.code, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
