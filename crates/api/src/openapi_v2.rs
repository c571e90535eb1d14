//! OpenAPI v2 (Swagger 2.0) at `/openapi/v2`: what kubectl before 1.27 reads to validate
//! a manifest on its side and to `explain` a field, and which it asks for only as kube's
//! protobuf (gnostic's `openapi.v2.Document`, `Accept:
//! application/com.github.proto-openapi.spec.v2@v1.0+protobuf`); other clients get JSON.
//! The document holds the definitions of every kind served, converted from the OpenAPI
//! v3 schemas of [`super::openapi`] as kube converts a CRD's (`$ref`s to `#/definitions/`,
//! no `nullable`, `anyOf`, `oneOf` or `not`; an int-or-string field has no `type`, an
//! object that keeps unknown fields neither `type` nor `properties`), each
//! kind tagged with `x-kubernetes-group-version-kind`; no paths (kubectl reads none).
//! Built once, on the first request. Pure: from the registry, no I/O.

use std::sync::OnceLock;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::discovery::KUBE_MINOR;
use crate::model::registry::Registry;

/// What kubectl < 1.27 sends in `Accept` for the protobuf form.
const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2";

/// The answer to `/openapi/v2`, or `None` for another path.
pub(crate) fn answer(reg: &'static Registry, path: &str, accept: &str) -> Option<Response> {
    if path.trim_end_matches('/') != "/openapi/v2" {
        return None;
    }
    let (json, pb) = documents(reg);
    let (ct, body) = match accept.contains(PROTOBUF) {
        true => (
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            pb,
        ),
        false => ("application/json", json),
    };
    // Built once and kept: each answer shares the bytes instead of copying them.
    let body = axum::body::Bytes::from_static(body.as_slice());
    Some((StatusCode::OK, [(header::CONTENT_TYPE, ct)], body).into_response())
}

/// The document as JSON and as protobuf, built once.
fn documents(reg: &'static Registry) -> &'static (Vec<u8>, Vec<u8>) {
    static DOCS: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    DOCS.get_or_init(|| {
        let doc = document(&super::openapi::schemas(reg));
        let pb = pb::document(&doc);
        (serde_json::to_vec(&doc).unwrap_or_default(), pb)
    })
}

/// The Swagger 2.0 document of `schemas` (OpenAPI v3 component schemas by name).
pub(crate) fn document(schemas: &Map<String, Value>) -> Value {
    let definitions: Map<String, Value> = (schemas.iter())
        .map(|(name, s)| (name.clone(), to_v2(s)))
        .collect();
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes (bootplane)", "version": format!("v1.{KUBE_MINOR}.0")},
        "paths": {},
        "definitions": definitions,
    })
}

/// One schema, v3 → v2, as kube's `ToStructuralOpenAPIV2` does for a CRD.
fn to_v2(s: &Value) -> Value {
    match s {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                match k.as_str() {
                    "nullable" | "anyOf" | "oneOf" | "not" => {}
                    "$ref" => {
                        let r = v.as_str().unwrap_or_default();
                        let r = r.replace("#/components/schemas/", "#/definitions/");
                        out.insert(k.clone(), json!(r));
                    }
                    "properties" => {
                        let props: Map<String, Value> = (v.as_object().into_iter().flatten())
                            .map(|(n, p)| (n.clone(), to_v2(p)))
                            .collect();
                        out.insert(k.clone(), Value::Object(props));
                    }
                    "items" | "additionalProperties" => {
                        out.insert(k.clone(), to_v2(v));
                    }
                    "allOf" => {
                        let all = v.as_array().into_iter().flatten().map(to_v2).collect();
                        out.insert(k.clone(), Value::Array(all));
                    }
                    _ => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            if out.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
                out.remove("type");
            }
            // v2 has no way to say "these properties and any others": a client
            // validating with it refuses every field it does not list, so such an
            // object is left open (no type, no properties), as kube publishes it.
            if out.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true)) {
                for k in ["type", "properties", "required", "additionalProperties"] {
                    out.remove(k);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// gnostic's `openapi.v2` messages, as far as the document uses them (the field numbers
/// of its `OpenAPIv2.proto`).
pub mod pb {
    use prost::Message as _;
    use serde_json::Value;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        pub definitions: Option<Definitions>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Info {
        #[prost(string, tag = "1")]
        pub title: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Paths {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Definitions {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedSchema {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "2")]
        pub yaml: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedAny {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Schema {
        #[prost(string, tag = "1")]
        pub r#ref: String,
        #[prost(string, tag = "2")]
        pub format: String,
        #[prost(string, tag = "4")]
        pub description: String,
        #[prost(string, repeated, tag = "19")]
        pub required: Vec<String>,
        #[prost(message, repeated, tag = "20")]
        pub r#enum: Vec<Any>,
        #[prost(message, optional, boxed, tag = "21")]
        pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
        #[prost(message, optional, tag = "22")]
        pub r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "23")]
        pub items: Option<ItemsItem>,
        #[prost(message, repeated, tag = "24")]
        pub all_of: Vec<Schema>,
        #[prost(message, optional, tag = "25")]
        pub properties: Option<Properties>,
        #[prost(message, repeated, tag = "31")]
        pub vendor_extension: Vec<NamedAny>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AdditionalPropertiesItem {
        #[prost(oneof = "Additional", tags = "1, 2")]
        pub oneof: Option<Additional>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Additional {
        #[prost(message, tag = "1")]
        Schema(Box<Schema>),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        pub value: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ItemsItem {
        #[prost(message, repeated, tag = "1")]
        pub schema: Vec<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Properties {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    fn yaml(v: &Value) -> Any {
        Any {
            yaml: serde_norway::to_string(v).unwrap_or_default(),
        }
    }

    fn text(v: Option<&Value>) -> String {
        v.and_then(Value::as_str).unwrap_or_default().to_string()
    }

    /// A v2 schema (JSON) as gnostic's `Schema`.
    pub fn schema(s: &Value) -> Schema {
        let named = |m: &serde_json::Map<String, Value>| -> Vec<NamedSchema> {
            (m.iter())
                .map(|(n, v)| NamedSchema {
                    name: n.clone(),
                    value: Some(schema(v)),
                })
                .collect()
        };
        let additional = match s.get("additionalProperties") {
            Some(Value::Bool(b)) => Some(Additional::Boolean(*b)),
            Some(v @ Value::Object(_)) => Some(Additional::Schema(Box::new(schema(v)))),
            _ => None,
        };
        Schema {
            r#ref: text(s.get("$ref")),
            format: text(s.get("format")),
            description: text(s.get("description")),
            required: (s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten())
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
            r#enum: (s
                .get("enum")
                .and_then(Value::as_array)
                .into_iter()
                .flatten())
            .map(yaml)
            .collect(),
            additional_properties: additional
                .map(|a| Box::new(AdditionalPropertiesItem { oneof: Some(a) })),
            r#type: s.get("type").and_then(Value::as_str).map(|t| TypeItem {
                value: vec![t.to_string()],
            }),
            items: s.get("items").map(|i| ItemsItem {
                schema: vec![schema(i)],
            }),
            all_of: (s
                .get("allOf")
                .and_then(Value::as_array)
                .into_iter()
                .flatten())
            .map(schema)
            .collect(),
            properties: s
                .get("properties")
                .and_then(Value::as_object)
                .map(|m| Properties {
                    additional_properties: named(m),
                }),
            vendor_extension: (s.as_object().into_iter().flatten())
                .filter(|(k, _)| k.starts_with("x-"))
                .map(|(k, v)| NamedAny {
                    name: k.clone(),
                    value: Some(yaml(v)),
                })
                .collect(),
        }
    }

    /// The v2 document (JSON) as gnostic's `Document`, encoded.
    pub fn document(doc: &Value) -> Vec<u8> {
        let defs = (doc
            .get("definitions")
            .and_then(Value::as_object)
            .into_iter()
            .flatten())
        .map(|(n, s)| NamedSchema {
            name: n.clone(),
            value: Some(schema(s)),
        })
        .collect();
        Document {
            swagger: text(doc.get("swagger")),
            info: Some(Info {
                title: text(doc.pointer("/info/title")),
                version: text(doc.pointer("/info/version")),
            }),
            paths: Some(Paths {}),
            definitions: Some(Definitions {
                additional_properties: defs,
            }),
        }
        .encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn v3_schemas_become_v2_definitions() {
        let schemas = json!({
            "a.v1.Thing": {"type": "object", "required": ["spec"], "x-kubernetes-group-version-kind": [{"group": "a", "version": "v1", "kind": "Thing"}],
                "properties": {"spec": {"type": "object", "nullable": true, "properties": {
                    "port": {"x-kubernetes-int-or-string": true, "type": "string", "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                    "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
                    "refs": {"type": "array", "items": {"$ref": "#/components/schemas/a.v1.Ref"}}}}}},
        });
        let doc = document(schemas.as_object().unwrap());
        let thing = &doc["definitions"]["a.v1.Thing"];
        let spec = &thing["properties"]["spec"];
        assert!(spec.get("nullable").is_none());
        assert_eq!(
            spec["properties"]["port"],
            json!({"x-kubernetes-int-or-string": true})
        );
        assert_eq!(
            spec["properties"]["refs"]["items"]["$ref"],
            "#/definitions/a.v1.Ref"
        );
        assert_eq!(doc["swagger"], "2.0");

        let bytes = pb::document(&doc);
        let back = pb::Document::decode(bytes.as_slice()).unwrap();
        let defs = back.definitions.unwrap().additional_properties;
        assert_eq!(defs[0].name, "a.v1.Thing");
        let s = defs[0].value.as_ref().unwrap();
        assert_eq!(s.r#type.as_ref().unwrap().value, ["object"]);
        assert_eq!(s.required, ["spec"]);
        let gvk = &s.vendor_extension[0];
        assert_eq!(gvk.name, "x-kubernetes-group-version-kind");
        let y: Value = serde_norway::from_str(&gvk.value.as_ref().unwrap().yaml).unwrap();
        assert_eq!(y, json!([{"group": "a", "version": "v1", "kind": "Thing"}]));
        let spec = &s.properties.as_ref().unwrap().additional_properties[0];
        let tags = (spec.value.as_ref().unwrap().properties.as_ref().unwrap())
            .additional_properties
            .iter()
            .find(|p| p.name == "tags")
            .unwrap();
        match &tags
            .value
            .as_ref()
            .unwrap()
            .additional_properties
            .as_ref()
            .unwrap()
            .oneof
        {
            Some(pb::Additional::Schema(s)) => {
                assert_eq!(s.r#type.as_ref().unwrap().value, ["string"])
            }
            other => panic!("{other:?}"),
        }
    }
}
