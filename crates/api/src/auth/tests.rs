//! Unit tests of `api::auth`: verb and resource derivation, role matching, tokens.
use super::*;
use crate::authz::{RoleConfig, Roles, RuleConfig};
use axum::http::Method;

fn attrs(m: &str, path: &str) -> Attrs {
    let (p, q) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    Attrs::derive(&Method::from_bytes(m.as_bytes()).unwrap(), p, q)
}

fn id(role: &str) -> Identity {
    Identity {
        user: "u".into(),
        groups: vec![role.into()],
    }
}

/// `(method, path, verb, resource, name, subresource, namespace)`.
type Case = (
    &'static str,
    String,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let s = "/apis/metal.ironcore.dev/v1alpha1/servers";
    vec![
        ("GET", s.to_string(), "list", "servers", None, None, None),
        ("GET", format!("{s}?watch=true&resourceVersion=3"), "watch", "servers", None, None, None),
        ("GET", format!("{s}?watch=1"), "watch", "servers", None, None, None),
        ("GET", format!("{s}?w%61tch=%74rue"), "watch", "servers", None, None, None),
        ("GET", format!("{s}?watch=false"), "list", "servers", None, None, None),
        ("GET", format!("{s}/a"), "get", "servers", Some("a"), None, None),
        ("PUT", format!("{s}/a/status"), "update", "servers", Some("a"), Some("status"), None),
        ("PATCH", format!("{s}/a"), "patch", "servers", Some("a"), None, None),
        ("DELETE", format!("{s}/a"), "delete", "servers", Some("a"), None, None),
        ("POST", s.to_string(), "create", "servers", None, None, None),
        ("GET", "/api/v1/namespaces/default/secrets/x".into(), "get", "secrets", Some("x"), None, Some("default")),
        ("GET", "/api/v1/namespaces/default/secrets".into(), "list", "secrets", None, None, Some("default")),
        ("GET", "/api/v1/secrets".into(), "list", "secrets", None, None, None),
        ("GET", "/metrics".into(), "get", "metrics", None, None, None),
        ("GET", "/apis".into(), "get", "discovery", None, None, None),
        ("GET", "/api".into(), "get", "discovery", None, None, None),
        ("GET", "/api/v1".into(), "get", "discovery", None, None, None),
        ("GET", "/version".into(), "get", "discovery", None, None, None),
        ("GET", "/openapi/v3/apis/metal.ironcore.dev/v1alpha1".into(), "get", "discovery", None, None, None),
        ("GET", "/apis/metal.ironcore.dev".into(), "get", "discovery", None, None, None),
        ("GET", "/apis/metal.ironcore.dev/v1alpha1".into(), "get", "discovery", None, None, None),
        ("GET", "/apis/dhcp.bootplane.dev/v1alpha1/leases".into(), "list", "leases", None, None, None),
        ("POST", "/apis/bootplane.dev/v1alpha1/jobs".into(), "create", "jobs", None, None, None),
        ("GET", "/apis/bootplane.dev/v1alpha1/jobs/j1".into(), "get", "jobs", Some("j1"), None, None),
        ("GET", "/apis/boot.bootplane.dev/v1alpha1/render/ignition/m1".into(), "get", "render", Some("m1"), Some("ignition"), None),
        ("OPTIONS", s.to_string(), "options", "servers", None, None, None),
    ]
}

#[test]
fn verbs_and_resources_are_derived_like_kube() {
    for (m, p, verb, res, name, sub, ns) in cases() {
        let a = attrs(m, &p);
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.name.as_deref(),
                a.sub.as_deref(),
                a.namespace.as_deref()
            ),
            (verb, res, name, sub, ns),
            "{m} {p}"
        );
    }
    let s = "/apis/metal.ironcore.dev/v1alpha1/servers";
    let a = attrs(
        "GET",
        "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims/c",
    );
    assert_eq!(
        (a.group.as_str(), a.resource.as_str()),
        ("metal.ironcore.dev", "serverclaims")
    );
    assert!(attrs("DELETE", &format!("{s}/a")).is_write());
    assert!(!attrs("GET", s).is_write());
}

#[test]
fn builtin_roles() {
    let r = Roles::new(&[]).unwrap();
    let s = "/apis/metal.ironcore.dev/v1alpha1/servers";
    let sec = "/api/v1/namespaces/default/secrets/x";
    let bmcsec = "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets/x";
    let tok = "/apis/auth.bootplane.dev/v1alpha1/apitokens";
    let allow = |role: &str, m: &str, p: &str| r.allows(&id(role), &attrs(m, p));
    for (m, p) in [
        ("GET", s),
        ("DELETE", sec),
        ("POST", tok),
        ("GET", "/metrics"),
        ("OPTIONS", s),
    ] {
        assert!(allow("admin", m, p), "admin {m} {p}");
    }
    assert!(allow("operator", "POST", s));
    assert!(allow("operator", "GET", sec));
    assert!(allow("operator", "PUT", &format!("{s}/a/status")));
    assert!(allow("operator", "GET", "/metrics"));
    assert!(!allow("operator", "GET", tok));
    assert!(!allow("operator", "POST", tok));
    assert!(allow("viewer", "GET", s));
    assert!(allow("viewer", "GET", &format!("{s}?watch=true")));
    assert!(allow("viewer", "GET", &format!("{s}/a/status")));
    assert!(allow(
        "viewer",
        "GET",
        "/apis/dhcp.bootplane.dev/v1alpha1/leases"
    ));
    for (m, p) in [
        ("POST", s),
        ("PATCH", &format!("{s}/a") as &str),
        ("GET", sec),
        ("GET", bmcsec),
        ("GET", tok),
        ("GET", "/metrics"),
        ("GET", "/apis/boot.bootplane.dev/v1alpha1/render/ignition/a"),
    ] {
        assert!(!allow("viewer", m, p), "viewer {m} {p}");
    }
    for role in ["agent", "operator", "viewer"] {
        for m in ["POST", "DELETE"] {
            let p = "/apis/bootplane.dev/v1alpha1/jobs/j1";
            assert!(!allow(role, m, p), "{role} {m} jobs");
        }
        assert!(!allow(role, "POST", "/apis/bootplane.dev/v1alpha1/jobs"));
    }
    assert!(allow(
        "operator",
        "GET",
        "/apis/bootplane.dev/v1alpha1/jobs/j1"
    ));
    assert!(allow("admin", "POST", "/apis/bootplane.dev/v1alpha1/jobs"));
    assert!(!allow("agent", "PATCH", &format!("{s}/a/status")));
    assert!(allow("agent", "GET", &format!("{s}/a/status")));
    assert!(allow("agent", "GET", s));
    for (m, p) in [
        ("GET", sec),
        ("GET", bmcsec),
        ("PATCH", &format!("{s}/a") as &str),
        ("DELETE", &format!("{s}/a")),
        ("GET", "/metrics"),
    ] {
        assert!(!allow("agent", m, p), "agent {m} {p}");
    }
    assert!(allow("metrics", "GET", "/metrics"));
    assert!(!allow("metrics", "GET", s));
    // No role: nothing; an unknown group grants nothing.
    assert!(!allow("nobody", "GET", s));
    assert!(!r.allows(
        &Identity {
            user: "u".into(),
            groups: vec![]
        },
        &attrs("GET", "/metrics")
    ));
}

#[test]
fn custom_roles_are_validated_and_matched() {
    let rc = |verbs: &[&str], res: &[&str]| RoleConfig {
        name: "claims".into(),
        rules: vec![RuleConfig {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources: res.iter().map(|s| s.to_string()).collect(),
            namespaces: None,
        }],
    };
    let e = Roles::new(&[rc(&["get", "frobnicate"], &["servers"])]).unwrap_err();
    assert!(
        e.contains("unknown verb \"frobnicate\"") && e.contains("claims"),
        "{e}"
    );
    let e = Roles::new(&[rc(&["get"], &["widgets"])]).unwrap_err();
    assert!(e.contains("widgets"), "{e}");
    let e = Roles::new(&[rc(&["get"], &["servers.example.com"])]).unwrap_err();
    assert!(e.contains("servers.example.com"), "{e}");
    let mut dup = rc(&["get"], &["servers"]);
    dup.name = "viewer".into();
    assert!(Roles::new(&[dup]).is_err());
    let r = Roles::new(&[rc(
        &["get", "list", "create", "delete"],
        &["serverclaims.metal.ironcore.dev", "servers/status"],
    )])
    .unwrap();
    let c = "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims";
    let allow = |m: &str, p: &str| r.allows(&id("claims"), &attrs(m, p));
    assert!(allow("POST", c));
    assert!(allow("DELETE", &format!("{c}/x")));
    assert!(!allow("PATCH", &format!("{c}/x")));
    assert!(!allow("GET", &format!("{c}?watch=true")));
    assert!(!allow("GET", &format!("{c}/x/status")));
    assert!(allow(
        "GET",
        "/apis/metal.ironcore.dev/v1alpha1/servers/a/status"
    ));
    assert!(!allow("GET", "/apis/metal.ironcore.dev/v1alpha1/servers/a"));
}

#[test]
fn namespaced_rules_allow_only_their_namespaces() {
    let rule = |ns: Option<Vec<&str>>| RoleConfig {
        name: "team-a".into(),
        rules: vec![RuleConfig {
            verbs: vec!["*".into()],
            resources: vec!["serverclaims".into(), "secrets".into()],
            namespaces: ns.map(|v| v.into_iter().map(String::from).collect()),
        }],
    };
    assert!(Roles::new(&[rule(Some(vec![]))])
        .unwrap_err()
        .contains("namespaces = []"));
    assert!(Roles::new(&[rule(Some(vec!["Not_A_Label"]))])
        .unwrap_err()
        .contains("Not_A_Label"));
    let r = Roles::new(&[rule(Some(vec!["a", "a2"]))]).unwrap();
    let allow = |m: &str, p: &str| r.allows(&id("team-a"), &attrs(m, p));
    let c = |ns: &str| format!("/apis/metal.ironcore.dev/v1alpha1/namespaces/{ns}/serverclaims");
    assert!(allow("POST", &c("a")));
    assert!(allow("GET", &format!("{}/x", c("a2"))));
    assert!(allow("GET", "/api/v1/namespaces/a/secrets/ign"));
    assert!(!allow("POST", &c("b")));
    assert!(!allow("GET", "/api/v1/namespaces/b/secrets/ign"));
    assert!(!allow("GET", &format!("{}?watch=true", c("b"))));
    // Lists and watches across namespaces name none: not allowed.
    assert!(!allow(
        "GET",
        "/apis/metal.ironcore.dev/v1alpha1/serverclaims"
    ));
    assert!(!allow("GET", "/api/v1/secrets?watch=true"));
    // Without the key: every namespace.
    let r = Roles::new(&[rule(None)]).unwrap();
    assert!(r.allows(&id("team-a"), &attrs("POST", &c("b"))));
    assert!(r.allows(
        &id("team-a"),
        &attrs("GET", "/apis/metal.ironcore.dev/v1alpha1/serverclaims")
    ));
}

#[test]
fn forbidden_names_verb_and_resource() {
    let a = attrs("GET", "/apis/metal.ironcore.dev/v1alpha1/servers");
    let e = a.forbidden("bob");
    assert_eq!(e.code, StatusCode::FORBIDDEN);
    assert_eq!(
        e.message,
        "servers.metal.ironcore.dev is forbidden: User \"bob\" cannot list resource \"servers\" in API group \"metal.ironcore.dev\" at the cluster scope"
    );
    let e = attrs("GET", "/api/v1/namespaces/default/secrets/s").forbidden("x");
    assert!(
        e.message
            .starts_with("secrets \"s\" is forbidden: User \"x\" cannot get resource \"secrets\""),
        "{}",
        e.message
    );
    assert!(e.message.ends_with("in the namespace \"default\""));
}

#[tokio::test]
async fn tokens_authenticate_by_hash_until_they_expire_or_go() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .unwrap();
    let now = chrono::Utc::now();
    let secret = "s3cret";
    store
        .create(
            &rt,
            json!({"apiVersion": "auth.bootplane.dev/v1alpha1", "kind": "APIToken",
            "metadata": {"name": "ci"},
            "spec": {"role": "viewer", "secretHash": secret_hash(secret),
                     "expiresAt": (now + chrono::Duration::hours(1)).to_rfc3339()}}),
        )
        .await
        .unwrap();
    let boot = "b".repeat(32);
    let auth = |t: &str, at| authenticate_token(&store, &boot, t, at);
    assert_eq!(auth(&boot, now).unwrap().user, "admin");
    let id = auth("bp1.ci.s3cret", now).unwrap();
    assert_eq!(
        id,
        Identity {
            user: "ci".into(),
            groups: vec!["viewer".into()]
        }
    );
    assert_eq!(auth("bp1.ci.s3crex", now), Err(AuthnError::Invalid));
    assert_eq!(auth("bp1.other.s3cret", now), Err(AuthnError::Invalid));
    assert_eq!(auth("ci.s3cret", now), Err(AuthnError::Invalid));
    assert_eq!(
        auth("bp1.ci.s3cret", now + chrono::Duration::hours(2)),
        Err(AuthnError::Expired)
    );
    store.delete(&rt, None, "ci", None).await.unwrap();
    assert_eq!(auth("bp1.ci.s3cret", now), Err(AuthnError::Invalid));
}

#[tokio::test]
async fn the_store_refuses_malformed_tokens() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .unwrap();
    let tok = |spec: Value| {
        json!({"apiVersion": "auth.bootplane.dev/v1alpha1", "kind": "APIToken",
               "metadata": {"name": "t"}, "spec": spec})
    };
    for bad in [
        json!({"role": "viewer", "secretHash": "md5:abc"}),
        json!({"role": "viewer", "secretHash": format!("sha256:{}", "A".repeat(64))}),
        json!({"secretHash": secret_hash("x")}),
        json!({"role": "viewer", "secretHash": secret_hash("x"), "expiresAt": "tomorrow"}),
        json!({"role": "viewer", "secretHash": secret_hash("x"), "token": "bp1.t.x"}),
    ] {
        let e = store.create(&rt, tok(bad.clone())).await.unwrap_err();
        assert!(
            matches!(e, crate::store::StoreError::Invalid { .. }),
            "{bad}: {e}"
        );
    }
    store
        .create(
            &rt,
            tok(json!({"role": "viewer", "secretHash": secret_hash("x")})),
        )
        .await
        .unwrap();
}
