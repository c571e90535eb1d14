//! Kubernetes API discovery, from the registry: what kubectl, client-go, kube-rs and
//! the Python client read before anything else.
//!
//! ```text
//! /version                    version.Info (the Kubernetes API level bootplane follows)
//! /api                        APIVersions (core group: v1)
//! /api/v1                     APIResourceList (secrets, events)
//! /apis                       APIGroupList
//! /apis/{group}               APIGroup
//! /apis/{group}/{version}     APIResourceList
//! ```
//!
//! `/api` and `/apis` answer the aggregated form (`APIGroupDiscoveryList`,
//! `apidiscovery.k8s.io` `v2`, or `v2beta1`) when `Accept` asks for it, as kubectl ≥ 1.30
//! does first; anything else gets the legacy documents above. Every resource lists the
//! verbs the REST layer serves, its short names, categories and singular name, and its
//! `status` subresource when it has one. Pure: documents from the registry, no I/O.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use crate::model::registry::{Registry, ResourceType};

/// The Kubernetes minor version whose API bootplane's surface follows (`/version`).
pub(crate) const KUBE_MINOR: &str = "32";

/// The verbs the REST layer serves on every resource ([`super::rest`]).
const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];
/// The verbs of a `status` subresource.
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

/// The answer to a discovery path, or `None` when `path` is not one (a resource path).
pub(crate) fn answer(
    reg: &Registry,
    path: &str,
    accept: &str,
    host: Option<&str>,
) -> Option<Response> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let json = |v: Value| (StatusCode::OK, axum::Json(v)).into_response();
    Some(match segs.as_slice() {
        ["version"] => json(version()),
        ["api"] => match aggregated(accept) {
            Some(v) => aggregated_response(v, &groups(reg, true)),
            None => json(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": host.unwrap_or_default()}
                ],
            })),
        },
        ["apis"] => match aggregated(accept) {
            Some(v) => aggregated_response(v, &groups(reg, false)),
            None => json(json!({
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": groups(reg, false).iter().map(|g| api_group(g)).collect::<Vec<_>>(),
            })),
        },
        ["api", "v1"] => json(resource_list(reg, "", "v1")?),
        ["apis", group] => match groups(reg, false).iter().find(|g| g.name == *group) {
            Some(g) => json(api_group(g)),
            None => not_found(path),
        },
        ["apis", group, version] => match resource_list(reg, group, version) {
            Some(v) => json(v),
            None => not_found(path),
        },
        _ => return None,
    })
}

fn not_found(path: &str) -> Response {
    ApiError::not_found(format!(
        "the server could not find the requested resource ({path})"
    ))
    .into_response()
}

/// `version.Info`: the Kubernetes API level bootplane follows, and bootplane's own
/// version after the `+`.
fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0+bootplane-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// The architecture as Go names it (`platform` is `GOOS/GOARCH`).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "s390x" => "s390x",
        other => other,
    }
}

/// One API group and the resource types of each of its versions, in registry order.
struct Group<'a> {
    name: &'a str,
    versions: Vec<(&'a str, Vec<&'a ResourceType>)>,
}

/// The core group alone (`core`), or every named group.
fn groups(reg: &Registry, core: bool) -> Vec<Group<'_>> {
    let mut out: Vec<Group<'_>> = Vec::new();
    for t in reg.types.iter().filter(|t| t.group.is_empty() == core) {
        let i = match out.iter().position(|g| g.name == t.group) {
            Some(i) => i,
            None => {
                out.push(Group {
                    name: &t.group,
                    versions: Vec::new(),
                });
                out.len() - 1
            }
        };
        let g = &mut out[i];
        match g.versions.iter_mut().find(|(v, _)| *v == t.version) {
            Some((_, types)) => types.push(&**t),
            None => g.versions.push((&t.version, vec![&**t])),
        }
    }
    out
}

fn group_version(group: &str, version: &str) -> String {
    match group {
        "" => version.to_string(),
        g => format!("{g}/{version}"),
    }
}

/// `APIGroup`: its versions, the first preferred (each group serves one today).
fn api_group(g: &Group<'_>) -> Value {
    let versions: Vec<Value> = g
        .versions
        .iter()
        .map(|(v, _)| json!({"groupVersion": group_version(g.name, v), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": g.name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `APIResourceList` of one group version, or `None` when it serves nothing.
fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResourceType> = (reg.types.iter())
        .filter(|t| t.group == group && t.version == version)
        .map(|t| &**t)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in types {
        resources.push(json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": VERBS,
            "shortNames": t.short_names,
            "categories": t.categories,
        }));
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

/// The aggregated discovery version `Accept` asks for (`v2` before `v2beta1`, as the
/// clients list them), or `None` for the legacy documents.
fn aggregated(accept: &str) -> Option<&'static str> {
    let asks = |v: &str| {
        accept.split(',').any(|m| {
            let params: Vec<&str> = m.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io")
                && params.contains(&"as=APIGroupDiscoveryList")
                && params.contains(&format!("v={v}").as_str())
        })
    };
    ["v2", "v2beta1"].into_iter().find(|v| asks(v))
}

/// `APIGroupDiscoveryList` of `groups` in discovery version `v`, with the media type
/// that tells the client which form it got.
fn aggregated_response(v: &str, groups: &[Group<'_>]) -> Response {
    let items: Vec<Value> = groups
        .iter()
        .map(|g| {
            let versions: Vec<Value> = g
                .versions
                .iter()
                .map(|(version, types)| {
                    json!({
                        "version": version,
                        "resources": types.iter().map(|t| discovered(t)).collect::<Vec<_>>(),
                        "freshness": "Current",
                    })
                })
                .collect();
            json!({"metadata": {"name": g.name}, "versions": versions})
        })
        .collect();
    let body = json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{v}"),
        "metadata": {},
        "items": items,
    });
    let ct = format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, ct)],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

/// One resource of an aggregated discovery document.
fn discovered(t: &ResourceType) -> Value {
    let kind = json!({"group": t.group, "version": t.version, "kind": t.kind});
    let mut r = json!({
        "resource": t.plural,
        "responseKind": kind,
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.singular,
        "verbs": VERBS,
        "shortNames": t.short_names,
        "categories": t.categories,
    });
    if t.status_subresource {
        r["subresources"] =
            json!([{"subresource": "status", "responseKind": kind, "verbs": STATUS_VERBS}]);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> (StatusCode, String, Value) {
        let code = r.status();
        let ct = (r.headers().get(header::CONTENT_TYPE))
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (code, ct, serde_json::from_slice(&b).unwrap())
    }

    fn get(path: &str, accept: &str) -> Option<Response> {
        answer(Registry::global(), path, accept, Some("127.0.0.1:1"))
    }

    #[tokio::test]
    async fn legacy_documents() {
        let (_, _, v) = body(get("/api", "application/json").unwrap()).await;
        assert_eq!(
            (v["kind"].as_str(), &v["versions"]),
            (Some("APIVersions"), &json!(["v1"]))
        );
        let (_, _, v) = body(get("/apis", "").unwrap()).await;
        assert_eq!(v["kind"], "APIGroupList");
        let names: Vec<&str> = (v["groups"].as_array().unwrap().iter())
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"metal.ironcore.dev"), "{names:?}");
        assert!(!names.contains(&""), "the core group is /api's");
        let (_, _, v) = body(get("/apis/metal.ironcore.dev/v1alpha1", "").unwrap()).await;
        let res = v["resources"].as_array().unwrap();
        let srv = res.iter().find(|r| r["name"] == "servers").unwrap();
        assert_eq!(
            (srv["kind"].as_str(), srv["namespaced"].as_bool()),
            (Some("Server"), Some(false))
        );
        assert!(
            srv["shortNames"]
                .as_array()
                .unwrap()
                .contains(&json!("srv")),
            "{srv}"
        );
        assert!(res.iter().any(|r| r["name"] == "servers/status"));
        let (_, _, v) = body(get("/api/v1", "").unwrap()).await;
        let names: Vec<&str> = (v["resources"].as_array().unwrap().iter())
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["secrets", "events"]);
        let (_, _, v) = body(get("/apis/metal.ironcore.dev", "").unwrap()).await;
        assert_eq!(
            v["preferredVersion"]["groupVersion"],
            "metal.ironcore.dev/v1alpha1"
        );
        let (_, _, v) = body(get("/version", "").unwrap()).await;
        assert_eq!(
            (v["major"].as_str(), v["minor"].as_str()),
            (Some("1"), Some(KUBE_MINOR))
        );
    }

    #[tokio::test]
    async fn aggregated_when_asked_v2_first() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        let (_, ct, v) = body(get("/apis", kubectl).unwrap()).await;
        assert_eq!(
            ct,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        );
        assert_eq!(v["apiVersion"], "apidiscovery.k8s.io/v2");
        let metal = (v["items"].as_array().unwrap().iter())
            .find(|g| g["metadata"]["name"] == "metal.ironcore.dev")
            .unwrap();
        let srv = (metal["versions"][0]["resources"].as_array().unwrap().iter())
            .find(|r| r["resource"] == "servers")
            .unwrap();
        assert_eq!(srv["scope"], "Cluster");
        assert_eq!(srv["subresources"][0]["subresource"], "status");
        let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        let (_, ct, v) = body(get("/api", beta).unwrap()).await;
        assert!(ct.contains("v=v2beta1"), "{ct}");
        assert_eq!(v["items"][0]["versions"][0]["version"], "v1");
    }

    #[tokio::test]
    async fn unknown_groups_are_404_and_resource_paths_are_not_discovery() {
        let (code, _, v) = body(get("/apis/widgets.example.com", "").unwrap()).await;
        assert_eq!(
            (code, v["reason"].as_str()),
            (StatusCode::NOT_FOUND, Some("NotFound"))
        );
        let (code, _, _) = body(get("/apis/metal.ironcore.dev/v9", "").unwrap()).await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert!(get("/apis/metal.ironcore.dev/v1alpha1/servers", "").is_none());
        assert!(get("/api/v1/namespaces/default/secrets", "").is_none());
    }
}
