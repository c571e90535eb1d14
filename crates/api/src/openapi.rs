//! OpenAPI v3, from the schemas bootplane validates with: what `kubectl explain` reads,
//! and what kubectl asks before it sends `fieldValidation=Strict` instead of validating
//! on its side.
//!
//! ```text
//! /openapi/v3                          the index: each group version and its document's URL
//! /openapi/v3/apis/{group}/{version}   one group version's OpenAPI 3.0 document
//! /openapi/v3/api/v1                   the core group's (Secrets, Events)
//! ```
//!
//! Each document has the paths of the REST layer (list, create, get, replace, patch,
//! delete; `status` where the type has it), every operation tagged with
//! `x-kubernetes-action` and `x-kubernetes-group-version-kind`, and the kinds' schemas
//! under `components.schemas`, named as kube names a CRD's (`dev.ironcore.metal.v1alpha1.Server`):
//! the CRD's `openAPIV3Schema` with `metadata` spelled out. The documents are built once
//! (the registry is fixed for the life of the process); the index carries each one's
//! SHA-256 so clients cache them by it. Pure: from the registry, no I/O.

use std::sync::OnceLock;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};

use super::discovery::KUBE_MINOR;
use super::error::ApiError;
use crate::model::registry::{Registry, ResourceType};

/// One group version's document: its path under `/openapi/v3/`, its text and hash.
struct Doc {
    path: String,
    text: Vec<u8>,
    hash: String,
}

/// The answer to an `/openapi/...` path, or `None` when `path` is not one.
pub(crate) fn answer(reg: &'static Registry, path: &str) -> Option<Response> {
    let rest = path.trim_matches('/').strip_prefix("openapi")?;
    let docs = docs(reg);
    let json = |text: Vec<u8>| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            text,
        )
            .into_response()
    };
    Some(match rest.trim_start_matches('/') {
        "v3" => {
            let mut paths = Map::new();
            for d in docs {
                let url = format!("/openapi/v3/{}?hash={}", d.path, d.hash);
                paths.insert(d.path.clone(), json!({"serverRelativeURL": url}));
            }
            json(serde_json::to_vec(&json!({"paths": paths})).unwrap_or_default())
        }
        p => match p
            .strip_prefix("v3/")
            .and_then(|gv| docs.iter().find(|d| d.path == gv))
        {
            Some(d) => json(d.text.clone()),
            None => ApiError::not_found(format!(
                "the server could not find the requested resource ({path})"
            ))
            .into_response(),
        },
    })
}

/// Every kind's schema (and its list's) by name, from all the group versions' documents
/// (what the OpenAPI v2 document is converted from).
pub(crate) fn schemas(reg: &'static Registry) -> Map<String, Value> {
    let mut all = Map::new();
    for d in docs(reg) {
        let doc: Value = serde_json::from_slice(&d.text).unwrap_or_default();
        if let Some(Value::Object(m)) = doc.pointer("/components/schemas") {
            all.extend(m.clone());
        }
    }
    all
}

fn docs(reg: &'static Registry) -> &'static [Doc] {
    static DOCS: OnceLock<(usize, Vec<Doc>)> = OnceLock::new();
    let (owner, docs) = DOCS.get_or_init(|| (reg as *const Registry as usize, build(reg)));
    debug_assert_eq!(
        *owner, reg as *const Registry as usize,
        "one registry per process"
    );
    docs
}

fn build(reg: &Registry) -> Vec<Doc> {
    let mut gvs: Vec<(&str, &str)> = Vec::new();
    for t in &reg.types {
        if !gvs.contains(&(t.group.as_str(), t.version.as_str())) {
            gvs.push((&t.group, &t.version));
        }
    }
    gvs.into_iter()
        .map(|(g, v)| {
            let types: Vec<&ResourceType> = (reg.types.iter())
                .filter(|t| t.group == g && t.version == v)
                .map(|t| &**t)
                .collect();
            let text = serde_json::to_vec(&document(&types)).unwrap_or_default();
            Doc {
                path: match g {
                    "" => format!("api/{v}"),
                    g => format!("apis/{g}/{v}"),
                },
                hash: hex::encode(&Sha256::digest(&text)[..16]).to_uppercase(),
                text,
            }
        })
        .collect()
}

/// `metal.ironcore.dev`, `v1alpha1`, `Server` → `dev.ironcore.metal.v1alpha1.Server`, as
/// the apiserver names a CRD's schema; the core group's are `io.k8s.api.core.v1.<Kind>`.
fn schema_name(t: &ResourceType, kind: &str) -> String {
    match t.group.as_str() {
        "" => format!("io.k8s.api.core.{}.{kind}", t.version),
        g => {
            let rev: Vec<&str> = g.split('.').rev().collect();
            format!("{}.{}.{kind}", rev.join("."), t.version)
        }
    }
}

fn gvk(t: &ResourceType, kind: &str) -> Value {
    json!({"group": t.group, "version": t.version, "kind": kind})
}

fn document(types: &[&ResourceType]) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for t in types {
        let name = schema_name(t, &t.kind);
        let list = schema_name(t, &format!("{}List", t.kind));
        schemas.insert(name.clone(), kind_schema(t));
        schemas.insert(
            list.clone(),
            json!({
                "type": "object",
                "description": format!("{}List is a list of {}.", t.kind, t.kind),
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object", "properties": {
                        "resourceVersion": {"type": "string"}, "continue": {"type": "string"}}},
                    "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{name}")}},
                },
                "x-kubernetes-group-version-kind": [gvk(t, &format!("{}List", t.kind))],
            }),
        );
        let base = match (t.group.as_str(), t.namespaced) {
            ("", _) => format!("/api/{}", t.version),
            (g, _) => format!("/apis/{g}/{}", t.version),
        };
        let scoped = match t.namespaced {
            true => format!("{base}/namespaces/{{namespace}}/{}", t.plural),
            false => format!("{base}/{}", t.plural),
        };
        let one = |action: &str, params: &[Value]| operation(t, action, &name, params);
        let ns_param = t.namespaced.then(|| path_param("namespace"));
        let mut coll = json!({
            "get": one("list", &list_params()),
            "post": one("post", &write_params()),
        });
        coll["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] =
            json!(format!("#/components/schemas/{list}"));
        coll["parameters"] = json!(ns_param.iter().collect::<Vec<_>>());
        paths.insert(scoped.clone(), coll);
        if t.namespaced {
            let mut all = json!({"get": one("list", &list_params())});
            all["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"] =
                json!(format!("#/components/schemas/{list}"));
            paths.insert(format!("{base}/{}", t.plural), all);
        }
        let item_params: Vec<Value> = std::iter::once(path_param("name"))
            .chain(ns_param.clone())
            .collect();
        let mut patch_params = write_params();
        patch_params.push(query_param("force", "boolean"));
        let mut item = json!({
            "get": one("get", &[]),
            "put": one("put", &write_params()),
            "patch": one("patch", &patch_params),
            "delete": one("delete", &[query_param("dryRun", "string"),
                query_param("propagationPolicy", "string")]),
        });
        item["parameters"] = json!(item_params);
        paths.insert(format!("{scoped}/{{name}}"), item);
        if t.status_subresource {
            let mut status = json!({
                "get": one("get", &[]),
                "put": one("put", &write_params()),
                "patch": one("patch", &patch_params),
            });
            status["parameters"] = json!(item_params);
            paths.insert(format!("{scoped}/{{name}}/status"), status);
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (bootplane)", "version": format!("v1.{KUBE_MINOR}.0")},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn operation(t: &ResourceType, action: &str, schema: &str, params: &[Value]) -> Value {
    let mut op = json!({
        "operationId": format!("{action}{}", t.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(t, &t.kind),
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {
            "schema": {"$ref": format!("#/components/schemas/{schema}")}}}}},
    });
    let body = |types: &[&str]| {
        let content: Map<String, Value> = (types.iter())
            .map(|ct| {
                (
                    ct.to_string(),
                    json!({"schema": {"$ref": format!("#/components/schemas/{schema}")}}),
                )
            })
            .collect();
        json!({"content": content, "required": true})
    };
    match action {
        "post" | "put" => op["requestBody"] = body(&["application/json", "application/yaml"]),
        "patch" => {
            op["requestBody"] = body(&[
                "application/merge-patch+json",
                "application/json-patch+json",
                "application/apply-patch+yaml",
            ])
        }
        _ => {}
    }
    op
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

fn query_param(name: &str, ty: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": ty, "uniqueItems": true}})
}

fn list_params() -> Vec<Value> {
    [
        ("labelSelector", "string"),
        ("fieldSelector", "string"),
        ("resourceVersion", "string"),
        ("watch", "boolean"),
    ]
    .iter()
    .map(|(n, t)| query_param(n, t))
    .collect()
}

/// What every write takes: `fieldValidation` is what kubectl looks for before it leaves
/// validation to the server.
fn write_params() -> Vec<Value> {
    ["dryRun", "fieldManager", "fieldValidation"]
        .iter()
        .map(|n| query_param(n, "string"))
        .collect()
}

/// A kind's schema: its CRD's `openAPIV3Schema` (an object of any shape for the kinds
/// declared without one), `metadata` spelled out, tagged with its group version kind.
fn kind_schema(t: &ResourceType) -> Value {
    let from_crd = t.crd.and_then(|c| {
        let crd: Value = serde_norway::from_str(c).ok()?;
        let versions = crd.pointer("/spec/versions")?.as_array()?;
        let v = versions.iter().find(|v| v["name"] == t.version.as_str())?;
        v.pointer("/schema/openAPIV3Schema").cloned()
    });
    let mut s = from_crd.unwrap_or_else(|| {
        json!({
            "type": "object",
            "description": format!("{} ({}).", t.kind, t.api_version()),
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}},
            "x-kubernetes-preserve-unknown-fields": true,
        })
    });
    if let Some(p) = s.get_mut("properties").and_then(Value::as_object_mut) {
        p.insert("metadata".into(), object_meta());
    }
    s["x-kubernetes-group-version-kind"] = json!([gvk(t, &t.kind)]);
    s
}

/// `ObjectMeta`, the fields bootplane keeps, with kube's descriptions in short.
fn object_meta() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    let map = |d: &str| json!({"type": "object", "additionalProperties": {"type": "string"}, "description": d});
    json!({
        "type": "object",
        "description": "Standard object's metadata.",
        "properties": {
            "name": s("Name must be unique within a namespace (or the cluster, for a cluster-scoped kind)."),
            "namespace": s("The namespace of a namespaced object."),
            "generateName": s("A prefix the server completes to a unique name when name is empty."),
            "uid": s("Unique in time and space; set by the server."),
            "resourceVersion": s("The version of this object, for optimistic concurrency and watches; opaque."),
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number of the desired state; set by the server."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "When this object was created; set by the server."},
            "deletionTimestamp": {"type": "string", "format": "date-time", "description": "When this object will be deleted, once its finalizers are gone."},
            "labels": map("Key-value pairs to select objects by."),
            "annotations": map("Key-value pairs for tools, not for selection."),
            "finalizers": {"type": "array", "items": {"type": "string"}, "description": "What must happen before the object is deleted."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "The objects this one depends on."},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> (StatusCode, Value) {
        let code = r.status();
        let b = axum::body::to_bytes(r.into_body(), 64 << 20).await.unwrap();
        (code, serde_json::from_slice(&b).unwrap())
    }

    #[tokio::test]
    async fn index_and_documents() {
        let reg = Registry::global();
        let (code, idx) = body(answer(reg, "/openapi/v3").unwrap()).await;
        assert_eq!(code, StatusCode::OK);
        let url = idx["paths"]["apis/metal.ironcore.dev/v1alpha1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(
            url.starts_with("/openapi/v3/apis/metal.ironcore.dev/v1alpha1?hash="),
            "{url}"
        );
        assert!(idx["paths"]["api/v1"].is_object(), "{idx}");
        let (_, doc) =
            body(answer(reg, "/openapi/v3/apis/metal.ironcore.dev/v1alpha1").unwrap()).await;
        let srv = &doc["components"]["schemas"]["dev.ironcore.metal.v1alpha1.Server"];
        assert_eq!(srv["x-kubernetes-group-version-kind"][0]["kind"], "Server");
        assert!(
            srv["properties"]["spec"]["properties"]["bmcRef"].is_object(),
            "{}",
            srv["properties"]["spec"]
        );
        assert!(srv["properties"]["metadata"]["properties"]["labels"].is_object());
        // kubectl leaves validation to the server when PATCH takes fieldValidation.
        let patch = &doc["paths"]["/apis/metal.ironcore.dev/v1alpha1/servers/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Server");
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        assert!(doc["paths"]["/apis/metal.ironcore.dev/v1alpha1/namespaces/{namespace}/serverclaims/{name}/status"].is_object());
        let (_, core) = body(answer(reg, "/openapi/v3/api/v1").unwrap()).await;
        assert!(core["components"]["schemas"]["io.k8s.api.core.v1.Secret"].is_object());
        let (code, _) = body(answer(reg, "/openapi/v3/apis/widgets.example.com/v1").unwrap()).await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert!(answer(reg, "/apis").is_none());
    }
}
