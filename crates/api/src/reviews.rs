//! The reviews a caller makes of itself, from bootplane's roles ([`super::authz`]):
//! `SelfSubjectAccessReview` (`kubectl auth can-i VERB RESOURCE`: may I?) and
//! `SelfSubjectRulesReview` (`kubectl auth can-i --list`: what may I?) and
//! `SelfSubjectReview` (`kubectl auth whoami`: who am I?). Every authenticated caller
//! may make them, whatever its role, as kube allows; nothing is stored.
//!
//! ```text
//! POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews
//! POST /apis/authorization.k8s.io/v1/selfsubjectrulesreviews
//! POST /apis/authentication.k8s.io/v1/selfsubjectreviews
//! ```
//!
//! The bodies are JSON or YAML, or kube's protobuf (`application/vnd.kubernetes.protobuf`,
//! what client-go's typed clients, kubectl's among them, send for built-in kinds): the
//! envelope ([`super::kubepb`]) and the fields a review reads are decoded with `prost`; the answer
//! is JSON, which those clients also accept.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use serde_json::{json, Value};

use super::authz::{Attrs, Identity};
use super::error::ApiError;
use super::state::ApiState;

pub(crate) const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
pub(crate) const RULES_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews";
pub(crate) const SUBJECT_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// Whether `path` is one of the reviews every authenticated caller may make.
pub(crate) fn is_self_review(path: &str) -> bool {
    [ACCESS_REVIEWS, RULES_REVIEWS, SUBJECT_REVIEWS].contains(&path)
}

/// The review routes (mounted behind authentication and audit).
pub(crate) fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route(ACCESS_REVIEWS, post(access_review))
        .route(RULES_REVIEWS, post(rules_review))
        .route(SUBJECT_REVIEWS, post(subject_review))
        .with_state(state)
}

async fn access_review(
    State(st): State<Arc<ApiState>>,
    Extension(id): Extension<Identity>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let review = match crate::kubepb::is_protobuf(&h) {
        true => pb::access_review(&body),
        false => super::bodies::decode_body(&st, &h, body).await,
    };
    let review = match review {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    match decide(&st.roles, &id, &review) {
        Ok(v) => (StatusCode::CREATED, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The review answered: its spec echoed, `status.allowed` from the roles.
fn decide(roles: &super::authz::Roles, id: &Identity, review: &Value) -> Result<Value, ApiError> {
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let text = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let attrs = if let Some(r) = spec.get("resourceAttributes").filter(|r| r.is_object()) {
        let opt = |k: &str| Some(text(r, k)).filter(|s| !s.is_empty());
        Attrs {
            verb: text(r, "verb"),
            group: text(r, "group"),
            resource: text(r, "resource"),
            sub: opt("subresource"),
            namespace: opt("namespace"),
            name: opt("name"),
        }
    } else if let Some(n) = spec.get("nonResourceAttributes").filter(|r| r.is_object()) {
        let method = match text(n, "verb").as_str() {
            "get" => Method::GET,
            "head" => Method::HEAD,
            "post" => Method::POST,
            "put" => Method::PUT,
            "patch" => Method::PATCH,
            "delete" => Method::DELETE,
            v => {
                return Err(ApiError::bad_request(format!(
                    "spec.nonResourceAttributes.verb: unknown verb {v:?}"
                )))
            }
        };
        let (path, query) = match text(n, "path") {
            p if p.contains('?') => {
                let (a, b) = p.split_once('?').unwrap_or_default();
                (a.to_string(), Some(b.to_string()))
            }
            p => (p, None),
        };
        Attrs::derive(&method, &path, query.as_deref())
    } else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec: exactly one of resourceAttributes and nonResourceAttributes is required",
        ));
    };
    if attrs.verb.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.resourceAttributes.verb: Required value",
        ));
    }
    let allowed = roles.allows(id, &attrs);
    let reason = match allowed {
        true => format!("allowed by a role of {}", id.groups.join(", ")),
        false => String::new(),
    };
    Ok(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": {"allowed": allowed, "reason": reason},
    }))
}

async fn rules_review(
    State(st): State<Arc<ApiState>>,
    Extension(id): Extension<Identity>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let review = match crate::kubepb::is_protobuf(&h) {
        true => pb::rules_review(&body),
        false => super::bodies::decode_body(&st, &h, body).await,
    };
    let ns = match review {
        Ok(v) => (v.pointer("/spec/namespace").and_then(Value::as_str))
            .unwrap_or("default")
            .to_string(),
        Err(e) => return e.into_response(),
    };
    let v = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "metadata": {"creationTimestamp": null},
        "spec": {"namespace": ns},
        "status": rules(st.roles.rules_of(&id), &ns),
    });
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

/// The rules that apply in namespace `ns`, as kube lists them: resources with their API
/// groups, and the non-resource URLs (`/metrics`; discovery's `/api`, `/apis`, ...).
fn rules(configs: Vec<&super::authz::RuleConfig>, ns: &str) -> Value {
    let mut resource_rules = Vec::new();
    let mut urls = Vec::new();
    for c in configs {
        if (c.namespaces.as_ref()).is_some_and(|l| !l.iter().any(|n| n == ns)) {
            continue;
        }
        let mut by_group: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for r in &c.resources {
            match r.as_str() {
                "*" => {
                    resource_rules
                        .push(json!({"verbs": c.verbs, "apiGroups": ["*"], "resources": ["*"]}));
                    urls.push(json!({"verbs": c.verbs, "nonResourceURLs": ["*"]}));
                }
                "metrics" => urls.push(json!({"verbs": c.verbs, "nonResourceURLs": ["/metrics"]})),
                "discovery" => urls.push(json!({"verbs": c.verbs, "nonResourceURLs":
                    ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version"]})),
                r => {
                    let (base, sub) = r.split_once('/').map_or((r, None), |(b, s)| (b, Some(s)));
                    let (plural, group) = match base.split_once('.') {
                        Some((p, g)) => (p, g.to_string()),
                        None => (base, group_of(base)),
                    };
                    let name = sub.map_or(plural.to_string(), |s| format!("{plural}/{s}"));
                    by_group.entry(group).or_default().push(name);
                }
            }
        }
        for (g, res) in by_group {
            resource_rules.push(json!({"verbs": c.verbs, "apiGroups": [g], "resources": res}));
        }
    }
    json!({"resourceRules": resource_rules, "nonResourceRules": urls, "incomplete": false})
}

/// The API group of a plural a rule names without one.
fn group_of(plural: &str) -> String {
    let reg = crate::model::registry::Registry::global();
    match reg.types.iter().find(|t| t.plural == plural) {
        Some(t) => t.group.clone(),
        None => (super::authz::NON_RESOURCES.iter())
            .find(|(r, _)| *r == plural)
            .map_or("*".to_string(), |(_, g)| g.to_string()),
    }
}

async fn subject_review(Extension(id): Extension<Identity>) -> Response {
    let v = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": {"username": id.user, "groups": id.groups}},
    });
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

/// kube's protobuf form of the reviews, as far as a review is read.
mod pb {
    use serde_json::{json, Map, Value};

    use super::ApiError;

    /// `SelfSubjectAccessReview` (`spec` only).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Review {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Spec {
        #[prost(message, optional, tag = "1")]
        pub resource_attributes: Option<ResourceAttributes>,
        #[prost(message, optional, tag = "2")]
        pub non_resource_attributes: Option<NonResourceAttributes>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub group: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub version: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub resource: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub subresource: Option<String>,
        #[prost(string, optional, tag = "7")]
        pub name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct NonResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub path: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
    }

    /// `SelfSubjectRulesReview` (`spec.namespace` only).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RulesReview {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<RulesSpec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RulesSpec {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
    }

    /// The object inside kube's envelope ([`crate::kubepb`]).
    fn raw(body: &[u8]) -> Result<Vec<u8>, ApiError> {
        Ok(crate::kubepb::open(body).map_err(ApiError::from)?.1)
    }

    /// The rules review in `body` as JSON (`{"spec": {"namespace": ...}}`).
    pub(super) fn rules_review(body: &[u8]) -> Result<Value, ApiError> {
        use prost::Message as _;
        let raw = raw(body)?;
        let r = RulesReview::decode(raw.as_slice())
            .map_err(|e| ApiError::bad_request(format!("protobuf body: {e}")))?;
        Ok(json!({"spec": {"namespace": r.spec.and_then(|s| s.namespace)}}))
    }

    /// The review in `body` as the JSON form [`super::decide`] reads.
    pub(super) fn access_review(body: &[u8]) -> Result<Value, ApiError> {
        use prost::Message as _;
        let raw = raw(body)?;
        let review = Review::decode(raw.as_slice())
            .map_err(|e| ApiError::bad_request(format!("protobuf body: {e}")))?;
        let spec = review.spec.unwrap_or_default();
        let fields = |pairs: &[(&str, &Option<String>)]| -> Value {
            let m: Map<String, Value> = (pairs.iter())
                .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), json!(v))))
                .collect();
            Value::Object(m)
        };
        let mut out = Map::new();
        if let Some(r) = &spec.resource_attributes {
            let attrs = [
                ("namespace", &r.namespace),
                ("verb", &r.verb),
                ("group", &r.group),
                ("version", &r.version),
                ("resource", &r.resource),
                ("subresource", &r.subresource),
                ("name", &r.name),
            ];
            out.insert("resourceAttributes".into(), fields(&attrs));
        }
        if let Some(n) = &spec.non_resource_attributes {
            out.insert(
                "nonResourceAttributes".into(),
                fields(&[("path", &n.path), ("verb", &n.verb)]),
            );
        }
        Ok(json!({"spec": out}))
    }

    #[cfg(test)]
    pub(super) fn encode(review: &Review) -> Vec<u8> {
        crate::kubepb::encode("authorization.k8s.io/v1", "SelfSubjectAccessReview", review)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::Roles;

    fn id(role: &str) -> Identity {
        Identity {
            user: format!("{role}-user"),
            groups: vec![role.into()],
        }
    }

    fn ask(role: &str, spec: Value) -> Result<bool, ApiError> {
        let roles = Roles::new(&[]).unwrap();
        let v = decide(&roles, &id(role), &json!({"spec": spec}))?;
        Ok(v["status"]["allowed"].as_bool().unwrap())
    }

    #[test]
    fn resource_and_non_resource_reviews_follow_the_roles() {
        let servers = |verb: &str| json!({"resourceAttributes": {"verb": verb, "group": "metal.ironcore.dev", "resource": "servers"}});
        assert!(ask("viewer", servers("list")).unwrap());
        assert!(!ask("viewer", servers("delete")).unwrap());
        assert!(ask("admin", servers("delete")).unwrap());
        let secrets = json!({"resourceAttributes": {"verb": "get", "resource": "secrets", "namespace": "default"}});
        assert!(!ask("viewer", secrets.clone()).unwrap());
        assert!(!ask("agent", secrets).unwrap());
        let status = json!({"resourceAttributes": {"verb": "patch", "group": "metal.ironcore.dev", "resource": "servers", "subresource": "status"}});
        assert!(
            !ask("agent", status).unwrap(),
            "an agent does not write identity"
        );
        let metrics = json!({"nonResourceAttributes": {"verb": "get", "path": "/metrics"}});
        assert!(ask("metrics", metrics.clone()).unwrap());
        assert!(!ask("agent", metrics).unwrap());
    }

    #[test]
    fn protobuf_reviews_as_kubectl_sends_them() {
        let review = pb::Review {
            spec: Some(pb::Spec {
                resource_attributes: Some(pb::ResourceAttributes {
                    namespace: Some("default".into()),
                    verb: Some("get".into()),
                    resource: Some("secrets".into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
        };
        let v = pb::access_review(&pb::encode(&review)).unwrap();
        assert_eq!(
            v,
            json!({"spec": {"resourceAttributes": {"namespace": "default", "verb": "get", "resource": "secrets"}}})
        );
        let roles = Roles::new(&[]).unwrap();
        let d = decide(&roles, &id("operator"), &v).unwrap();
        assert_eq!(d["status"]["allowed"], true);
        assert!(pb::access_review(b"{}").is_err(), "no envelope");
        assert!(pb::access_review(b"k8s\0\xff\xff").is_err(), "truncated");
    }

    #[test]
    fn rules_as_kube_lists_them() {
        let roles = Roles::new(&[]).unwrap();
        let r = rules(roles.rules_of(&id("agent")), "default");
        let res = r["resourceRules"].as_array().unwrap();
        let metal = (res.iter())
            .find(|r| {
                r["apiGroups"] == json!(["metal.ironcore.dev"])
                    && r["verbs"].as_array().unwrap().len() == 3
            })
            .unwrap();
        assert_eq!(metal["verbs"], json!(["get", "list", "watch"]));
        assert!(
            metal["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("servers")),
            "{r}"
        );
        assert!(
            res.iter()
                .any(|x| x["resources"] == json!(["serveractions/status"])),
            "{r}"
        );
        let urls = &r["nonResourceRules"][0]["nonResourceURLs"];
        assert!(urls.as_array().unwrap().contains(&json!("/apis")), "{r}");
        let admin = rules(roles.rules_of(&id("admin")), "default");
        assert_eq!(admin["resourceRules"][0]["resources"], json!(["*"]));
        let nobody = rules(roles.rules_of(&id("nobody")), "default");
        assert!(nobody["resourceRules"].as_array().unwrap().is_empty());
    }

    #[test]
    fn a_review_without_attributes_is_invalid() {
        let e = ask("admin", json!({})).unwrap_err();
        assert_eq!(e.code, StatusCode::UNPROCESSABLE_ENTITY);
        let e = ask(
            "admin",
            json!({"resourceAttributes": {"resource": "servers"}}),
        )
        .unwrap_err();
        assert!(e.message.contains("verb"), "{}", e.message);
        let e = ask(
            "admin",
            json!({"nonResourceAttributes": {"verb": "fly", "path": "/"}}),
        )
        .unwrap_err();
        assert_eq!(e.code, StatusCode::BAD_REQUEST);
    }
}
