//! Who is calling the API and what they may do: authentication (the bootstrap token,
//! named bearer tokens stored as `APIToken` objects, verified client certificates) and
//! authorization (roles as rules of verbs × resources, kube's RBAC without bindings: a
//! caller's groups that name a role grant it).
//!
//! Every route of the API listener but `/healthz` and `/readyz` goes through
//! [`middleware`]: authenticate (401), derive the request's [`Attrs`] (verb, API
//! group, resource, namespace, name), authorize against the caller's roles (403 with a
//! kube `Status` naming the verb and resource), then hand the request on with the
//! [`Identity`] as an extension; writes and denials are written to the audit log
//! ([`super::audit`]).
//!
//! Named tokens look like `bp1.NAME.SECRET`: NAME is the `APIToken` object
//! (`auth.bootplane.dev/v1alpha1`, cluster-scoped) holding the role, the expiry and the
//! SHA-256 of SECRET, so checking a token is one get from the store (in memory on both
//! engines) and one hash. SECRET is 256 random bits from the OS generator: nobody can
//! guess or brute-force a preimage of its hash, so a slow password KDF (bcrypt,
//! argon2) would add a per-request cost and no security; KDFs exist for low-entropy
//! human passwords. Hashes are compared in constant time. A token is revoked by deleting
//! its object: the next request with it is 401.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::rest::{ApiError, ApiState};
use super::tls::PeerCert;
use crate::model::registry::Registry;
use crate::store::Store;

/// The API group of `APIToken`.
pub const GROUP: &str = "auth.bootplane.dev";
/// The plural of `APIToken`.
pub const TOKENS: &str = "apitokens";
/// The user of the bootstrap token (`[api] token` or `<state_dir>/api-token`).
pub const BOOTSTRAP_USER: &str = "admin";
/// How named tokens start (the format's version).
pub const TOKEN_PREFIX: &str = "bp1.";
/// The longest lifetime a token may be created with (10 years).
pub const MAX_TTL_SECONDS: u64 = 10 * 366 * 86_400;

/// The authenticated caller, inserted as a request extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    /// A group named like a role grants that role.
    pub groups: Vec<String>,
}

/// The verbs of a rule, as kube derives them from the method, the path and `watch`.
pub const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Names of API routes that are not stored resources, each with its API group
/// (empty: no group).
pub const NON_RESOURCES: [(&str, &str); 5] = [
    ("metrics", ""),
    ("discovery", ""),
    ("leases", "dhcp.bootplane.dev"),
    ("jobs", "bootplane.dev"),
    ("render", "boot.bootplane.dev"),
];

/// What a request asks to do, derived from its method, path and query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// One of [`VERBS`], or the method in lower case when it maps to none (only a
    /// rule with verb `*` allows that).
    pub verb: String,
    pub group: String,
    /// The plural (`servers`), or a non-resource name ([`NON_RESOURCES`]); empty for a
    /// path that names neither (only `*` allows it).
    pub resource: String,
    pub sub: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Attrs {
    /// Derive the attributes of a request the way kube's request-info resolver does:
    /// GET on a collection is `list` (`watch` with `watch=true`), on an object `get`;
    /// POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`.
    pub fn derive(method: &Method, path: &str, query: Option<&str>) -> Attrs {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut a = Attrs {
            verb: String::new(),
            group: String::new(),
            resource: String::new(),
            sub: None,
            namespace: None,
            name: None,
        };
        let rest: &[&str] = match segs.as_slice() {
            ["metrics"] => {
                a.resource = "metrics".into();
                &[]
            }
            ["apis"] | ["api"] => {
                a.resource = "discovery".into();
                &[]
            }
            ["api", _v, rest @ ..] => rest,
            ["apis", "boot.bootplane.dev", _v, "render", rest @ ..] => {
                a.group = "boot.bootplane.dev".into();
                a.resource = "render".into();
                a.sub = rest.first().map(|s| s.to_string());
                a.name = rest.get(1).map(|s| s.to_string());
                &[]
            }
            ["apis", g, _v, rest @ ..] => {
                a.group = g.to_string();
                rest
            }
            _ => &[],
        };
        let rest = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => {
                a.namespace = Some(ns.to_string());
                rest
            }
            r => r,
        };
        if let [plural, more @ ..] = rest {
            a.resource = plural.to_string();
            a.name = more.first().map(|s| s.to_string());
            a.sub = more.get(1).map(|s| s.to_string());
        }
        // Decoded as the handler decodes it; any `watch` pair that turns a list into a
        // watch there makes this a watch (stricter than last-one-wins, never looser).
        let watch = query.is_some_and(|q| {
            q.split('&').any(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let dec = |s: &str| {
                    percent_encoding::percent_decode_str(&s.replace('+', " "))
                        .decode_utf8_lossy()
                        .into_owned()
                };
                dec(k) == "watch" && matches!(dec(v).as_str(), "true" | "1")
            })
        });
        a.verb = match *method {
            Method::GET | Method::HEAD
                if a.name.is_none() && a.resource != "metrics" && a.resource != "discovery" =>
            {
                if watch {
                    "watch".into()
                } else {
                    "list".into()
                }
            }
            Method::GET | Method::HEAD => "get".into(),
            Method::POST => "create".into(),
            Method::PUT => "update".into(),
            Method::PATCH => "patch".into(),
            Method::DELETE => "delete".into(),
            ref m => m.as_str().to_ascii_lowercase(),
        };
        a
    }

    /// Whether the request would change something (POST, PUT, PATCH, DELETE).
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete")
    }

    /// `resource[/sub]`, as the audit log and rules name it.
    pub fn resource_path(&self) -> String {
        match &self.sub {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// kube's forbidden message: `servers.metal.ironcore.dev "a" is forbidden: User "x"
    /// cannot delete resource "servers" in API group "metal.ironcore.dev" at the
    /// cluster scope`.
    pub fn forbidden(&self, user: &str) -> ApiError {
        let qualified = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let what = match &self.name {
            Some(n) => format!("{qualified} {n:?}"),
            None => qualified,
        };
        let scope = match &self.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".into(),
        };
        let mut e = ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{what} is forbidden: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
                self.verb,
                self.resource_path(),
                self.group
            ),
        );
        e.details = Some(json!({"name": self.name, "group": self.group, "kind": self.resource}));
        e
    }
}

/// A rule as the config writes it: `{ verbs = ["get", "list"], resources = ["servers"] }`,
/// optionally limited to namespaces (`namespaces = ["team-a"]`: only requests whose path
/// names one of them; absent: every namespace and the cluster scope).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub verbs: Vec<String>,
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
}

/// A custom role from `[[api.roles]]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    pub name: String,
    pub rules: Vec<RuleConfig>,
}

/// A resource a rule names: `*`, `plural`, `plural.group`, each optionally with
/// `/sub` or `/*` (any subresource; the plain name is the object itself only).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    Any,
    Named {
        resource: String,
        group: Option<String>,
        sub: SubPattern,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum SubPattern {
    None,
    Any,
    Named(String),
}

impl Pattern {
    fn parse(s: &str) -> Result<Pattern, String> {
        if s == "*" {
            return Ok(Pattern::Any);
        }
        let (base, sub) = match s.split_once('/') {
            None => (s, SubPattern::None),
            Some((b, "*")) => (b, SubPattern::Any),
            Some((b, sub)) if !sub.is_empty() && !sub.contains('/') => {
                (b, SubPattern::Named(sub.to_string()))
            }
            Some(_) => return Err(format!("invalid resource {s:?}")),
        };
        let (resource, group) = match base.split_once('.') {
            Some((r, g)) => (r, Some(g.to_string())),
            None => (base, None),
        };
        let known = known_resources();
        if !known
            .iter()
            .any(|(r, g)| *r == resource && group.as_deref().is_none_or(|x| x == g))
        {
            return Err(format!("unknown resource {s:?}"));
        }
        Ok(Pattern::Named {
            resource: resource.to_string(),
            group,
            sub,
        })
    }

    fn matches(&self, a: &Attrs) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Named {
                resource,
                group,
                sub,
            } => {
                *resource == a.resource
                    && group.as_deref().is_none_or(|g| g == a.group)
                    && match (sub, &a.sub) {
                        (SubPattern::None, None) => true,
                        (SubPattern::Any, Some(_)) => true,
                        (SubPattern::Named(x), Some(y)) => x == y,
                        _ => false,
                    }
            }
        }
    }
}

/// Every `(resource, group)` a rule may name: the registry's types and [`NON_RESOURCES`].
fn known_resources() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Registry::global()
        .types
        .iter()
        .map(|t| (t.plural.clone(), t.group.clone()))
        .collect();
    v.extend(
        NON_RESOURCES
            .iter()
            .map(|(r, g)| (r.to_string(), g.to_string())),
    );
    v
}

#[derive(Clone, Debug)]
struct Rule {
    /// Bit i set: `VERBS[i]` allowed; `ALL_VERBS` also allows unknown methods.
    verbs: u16,
    resources: Vec<Pattern>,
    /// `Some`: only requests in one of these namespaces (not cluster-scoped ones, not
    /// lists across namespaces).
    namespaces: Option<Vec<String>>,
}

const ALL_VERBS: u16 = 0xffff;

impl Rule {
    fn parse(c: &RuleConfig) -> Result<Rule, String> {
        let mut verbs = 0u16;
        for v in &c.verbs {
            if v == "*" {
                verbs = ALL_VERBS;
            } else if let Some(i) = VERBS.iter().position(|x| x == v) {
                verbs |= 1 << i;
            } else {
                return Err(format!(
                    "unknown verb {v:?} (verbs: {}, or *)",
                    VERBS.join(", ")
                ));
            }
        }
        if c.verbs.is_empty() || c.resources.is_empty() {
            return Err("a rule needs at least one verb and one resource".into());
        }
        let resources = c
            .resources
            .iter()
            .map(|r| Pattern::parse(r))
            .collect::<Result<_, _>>()?;
        if let Some(ns) = &c.namespaces {
            if ns.is_empty() {
                return Err("namespaces = [] matches nothing: name at least one namespace, or leave the key out for all".into());
            }
            if let Some(bad) = ns.iter().find(|n| !valid_token_name(n)) {
                return Err(format!("invalid namespace {bad:?}"));
            }
        }
        Ok(Rule {
            verbs,
            resources,
            namespaces: c.namespaces.clone(),
        })
    }

    fn allows(&self, a: &Attrs) -> bool {
        let verb_ok = match VERBS.iter().position(|v| *v == a.verb) {
            Some(i) => self.verbs & (1 << i) != 0,
            None => self.verbs == ALL_VERBS,
        };
        let ns_ok = match (&self.namespaces, &a.namespace) {
            (None, _) => true,
            (Some(list), Some(ns)) => list.iter().any(|n| n == ns),
            (Some(_), None) => false,
        };
        verb_ok && ns_ok && self.resources.iter().any(|p| p.matches(a))
    }
}

/// The built-in roles' names.
pub const BUILTIN_ROLES: [&str; 5] = ["admin", "operator", "viewer", "agent", "metrics"];

/// Resources only `admin` and `operator` may touch at all (`apitokens`: `admin` only).
const SENSITIVE: [&str; 3] = ["secrets", "bmcsecrets", TOKENS];

/// The roles the server knows: the built-in ones and the config's.
#[derive(Clone, Debug)]
pub struct Roles {
    roles: Vec<(String, Vec<Rule>)>,
}

impl Roles {
    /// The built-in roles plus `custom` (validated: names unique and not built-in,
    /// verbs and resources known).
    pub fn new(custom: &[RoleConfig]) -> Result<Roles, String> {
        let fleet: Vec<String> = Registry::global()
            .types
            .iter()
            .map(|t| t.plural.clone())
            .filter(|p| p != TOKENS)
            .collect();
        let with_subs = |names: &[String]| -> Vec<String> {
            names
                .iter()
                .flat_map(|n| [n.clone(), format!("{n}/*")])
                .collect()
        };
        let rule = |verbs: &[&str], resources: Vec<String>| RuleConfig {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources,
            namespaces: None,
        };
        let read = ["get", "list", "watch"];
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut operator = with_subs(&fleet);
        operator.extend(s(&["leases", "render/*", "discovery"]));
        let public: Vec<String> = fleet
            .iter()
            .filter(|p| !SENSITIVE.contains(&p.as_str()))
            .cloned()
            .collect();
        let mut viewer = with_subs(&public);
        viewer.extend(s(&["leases", "jobs", "discovery"]));
        let builtin: Vec<RoleConfig> = vec![
            RoleConfig {
                name: "admin".into(),
                rules: vec![rule(&["*"], s(&["*"]))],
            },
            RoleConfig {
                name: "operator".into(),
                // Jobs are the controller's: an operator reads them, never starts one.
                rules: vec![
                    rule(&["*"], operator),
                    rule(&read, s(&["jobs"])),
                    rule(&["get"], s(&["metrics"])),
                ],
            },
            RoleConfig {
                name: "viewer".into(),
                rules: vec![rule(&read, viewer)],
            },
            // What an agent driven from outside needs: reading the objects that say
            // what to provision, and reporting progress on the actions' status. No
            // secrets, no rendered configs, no jobs (the controller starts those), and
            // no Server status: its NICs are the identity the boot listener trusts,
            // written by the controllers (docs/threat-model.md).
            RoleConfig {
                name: "agent".into(),
                rules: vec![
                    rule(
                        &read,
                        s(&["servers", "serveractions", "images", "discovery"]),
                    ),
                    rule(&["get"], s(&["servers/status"])),
                    rule(&["get", "update", "patch"], s(&["serveractions/status"])),
                ],
            },
            RoleConfig {
                name: "metrics".into(),
                rules: vec![rule(&["get"], s(&["metrics"]))],
            },
        ];
        let mut roles = Vec::new();
        for r in builtin.iter().chain(custom) {
            if r.name.is_empty() || roles.iter().any(|(n, _)| *n == r.name) {
                return Err(format!(
                    "role {:?} is defined twice or is a built-in role",
                    r.name
                ));
            }
            let rules = r
                .rules
                .iter()
                .map(Rule::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("role {:?}: {e}", r.name))?;
            roles.push((r.name.clone(), rules));
        }
        Ok(Roles { roles })
    }

    pub fn exists(&self, name: &str) -> bool {
        self.roles.iter().any(|(n, _)| n == name)
    }

    /// Whether any role named by one of `id`'s groups allows `a`.
    pub fn allows(&self, id: &Identity, a: &Attrs) -> bool {
        self.roles
            .iter()
            .filter(|(n, _)| id.groups.iter().any(|g| g == n))
            .any(|(_, rules)| rules.iter().any(|r| r.allows(a)))
    }
}

/// Why a request was not authenticated (the message of its 401).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthnError {
    #[error("missing bearer token or client certificate")]
    Missing,
    #[error("invalid bearer token")]
    Invalid,
    #[error("bearer token expired")]
    Expired,
}

/// Constant-time equality of two byte strings (their lengths are not secret).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `sha256:<hex>` of a token's secret part, as stored in `spec.secretHash`.
pub fn secret_hash(secret: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(secret.as_bytes())))
}

/// A name a token may have: a DNS label (no dots, so `bp1.NAME.SECRET` splits one way).
pub fn valid_token_name(n: &str) -> bool {
    crate::model::meta::valid_dns_label(n)
}

/// Who presents `bearer` (the text after `Bearer `): the bootstrap token, or a named
/// token found in the store, unexpired, whose secret hashes to the stored hash.
pub fn authenticate_token(
    store: &Store,
    bootstrap: &str,
    bearer: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Identity, AuthnError> {
    let bearer = bearer.trim();
    if ct_eq(bearer.as_bytes(), bootstrap.as_bytes()) {
        return Ok(Identity {
            user: BOOTSTRAP_USER.into(),
            groups: vec!["admin".into()],
        });
    }
    let (name, secret) = bearer
        .strip_prefix(TOKEN_PREFIX)
        .and_then(|r| r.split_once('.'))
        .ok_or(AuthnError::Invalid)?;
    if !valid_token_name(name) {
        return Err(AuthnError::Invalid);
    }
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .expect("APIToken is registered");
    let obj = store
        .get(&rt, None, name)
        .map_err(|_| AuthnError::Invalid)?;
    let stored = obj
        .pointer("/spec/secretHash")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !ct_eq(secret_hash(secret).as_bytes(), stored.as_bytes()) {
        return Err(AuthnError::Invalid);
    }
    if let Some(exp) = obj.pointer("/spec/expiresAt").and_then(Value::as_str) {
        match chrono::DateTime::parse_from_rfc3339(exp) {
            Ok(t) if t > now => {}
            _ => return Err(AuthnError::Expired),
        }
    }
    let role = obj
        .pointer("/spec/role")
        .and_then(Value::as_str)
        .unwrap_or("");
    Ok(Identity {
        user: name.to_string(),
        groups: vec![role.to_string()],
    })
}

/// The identity of a request: its bearer token if it has one, else its verified
/// client certificate (CN → user, O → groups).
fn authenticate(st: &ApiState, req: &Request) -> Result<Identity, AuthnError> {
    if let Some(h) = req.headers().get(header::AUTHORIZATION) {
        let t = h
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or(AuthnError::Invalid)?;
        return authenticate_token(&st.store, &st.token, t, chrono::Utc::now());
    }
    match req.extensions().get::<PeerCert>() {
        Some(c) if !c.cn.is_empty() => Ok(Identity {
            user: c.cn.clone(),
            groups: c.orgs.clone(),
        }),
        _ => Err(AuthnError::Missing),
    }
}

/// Authenticate, authorize, run, audit: in front of every API route. Between
/// authentication and authorization, [`super::guard`]'s checks: a body that is neither
/// JSON nor YAML is 415, and a request authenticated only by a client certificate that a
/// browser sent from another site is 403 (a bearer token is not ambient: a page on
/// another site cannot attach it).
pub async fn middleware(State(st): State<Arc<ApiState>>, mut req: Request, next: Next) -> Response {
    use http_body::Body as _;
    let attrs = Attrs::derive(req.method(), req.uri().path(), req.uri().query());
    let source = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let has_body = !req.body().is_end_stream() && req.body().size_hint().exact() != Some(0);
    let bearer = req.headers().get(header::AUTHORIZATION);
    // A named token (not the bootstrap one): its last use is recorded.
    let named = bearer.is_some_and(|h| h.as_bytes().starts_with(b"Bearer bp1."));
    let bearer = bearer.is_some();
    let (resp, id) = match authenticate(&st, &req) {
        Err(e) => {
            // Summed per source in the audit log; one line per request here would let
            // anyone who can connect flood the journal.
            tracing::debug!(path = %req.uri().path(), source = ?source, reason = %e, "api request not authenticated");
            let r = ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", e.to_string());
            (r.into_response(), None)
        }
        Ok(id) => {
            let refused = super::guard::check_media(req.headers(), has_body)
                .err()
                .or_else(|| {
                    (!bearer && super::guard::cross_site(req.headers(), req.uri()))
                        .then(|| super::guard::cross_site_refusal(&id.user))
                });
            if let Some(e) = refused {
                tracing::info!(user = %id.user, verb = %attrs.verb, resource = %attrs.resource_path(), code = e.code.as_u16(), "api request refused");
                (e.into_response(), Some(id))
            } else if !st.roles.allows(&id, &attrs) && req.uri().path() != super::ui::WHOAMI_PATH {
                // Every authenticated caller may ask what it may do (the dashboard's whoami).
                tracing::info!(user = %id.user, verb = %attrs.verb, resource = %attrs.resource_path(), "api request forbidden");
                (attrs.forbidden(&id.user).into_response(), Some(id))
            } else {
                if named {
                    st.token_use.note(&st.store, &id.user);
                }
                req.extensions_mut().insert(id.clone());
                (next.run(req).await, Some(id))
            }
        }
    };
    let code = resp.status().as_u16();
    if attrs.is_write() || code == 401 || code == 403 {
        let groups = id.as_ref().map(|i| i.groups.clone()).unwrap_or_default();
        let user = id
            .as_ref()
            .map(|i| i.user.as_str())
            .unwrap_or("system:anonymous");
        st.audit
            .record(&super::audit::Event {
                user,
                groups: &groups,
                source,
                attrs: &attrs,
                code,
            })
            .await;
    }
    resp
}

/// The annotation of an `APIToken` holding when it was last used (RFC 3339, to the
/// minute: written at most once per [`LAST_USED_EVERY`] per token).
pub const LAST_USED: &str = "auth.bootplane.dev/last-used";
/// How often a token's [`LAST_USED`] is written at most.
pub const LAST_USED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// The lifetime of a token made without `spec.ttlSeconds` (90 days); `0` asks for none.
pub const DEFAULT_TTL_SECONDS: u64 = 90 * 86_400;

/// When each named token was last noted as used (in this process), so that a token's
/// use costs a store write at most once a minute, not once a request.
#[derive(Default)]
pub struct TokenUse {
    seen: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl TokenUse {
    /// `user` just authenticated with a bearer token: if it is a named token not noted
    /// within [`LAST_USED_EVERY`] (here, or in its stored annotation), write its
    /// [`LAST_USED`] in the background.
    pub fn note(&self, store: &Store, user: &str) {
        let now = std::time::Instant::now();
        {
            let mut m = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if m.get(user)
                .is_some_and(|t| now.duration_since(*t) < LAST_USED_EVERY)
            {
                return;
            }
            if m.len() >= 4096 {
                m.retain(|_, t| now.duration_since(*t) < LAST_USED_EVERY);
            }
            m.insert(user.to_string(), now);
        }
        let Some(rt) = Registry::global().by_plural(GROUP, "v1alpha1", TOKENS) else {
            return;
        };
        // The bootstrap token and certificate users have no object.
        let Ok(obj) = store.get(&rt, None, user) else {
            return;
        };
        let wall = chrono::Utc::now();
        if let Some(t) = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(LAST_USED))
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        {
            if wall.signed_duration_since(t)
                < chrono::Duration::from_std(LAST_USED_EVERY).unwrap_or_default()
            {
                return;
            }
        }
        let patch = json!({"metadata": {"annotations": {
            LAST_USED: wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        }}});
        let (store, name) = (store.clone(), user.to_string());
        tokio::spawn(async move {
            if let Err(e) = store
                .patch(&rt, None, &name, &patch, crate::store::Part::Main)
                .await
            {
                tracing::debug!(token = %name, error = %e, "recording a token's last use");
            }
        });
    }
}

/// `POST /apis/auth.bootplane.dev/v1alpha1/apitokens`: make a token. The body names it
/// and its role (`{"metadata": {"name": N}, "spec": {"role": R, "ttlSeconds": S}}`;
/// without `ttlSeconds` it expires after [`DEFAULT_TTL_SECONDS`], `0` never);
/// the secret is generated here, only its hash is stored, and the answer (201) is the
/// stored object with the token in `status.token`, the only time it is shown.
pub async fn issue(st: &ApiState, body: &Value) -> Result<Response, ApiError> {
    let name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !valid_token_name(name) {
        return Err(ApiError::bad_request(format!(
            "invalid token name {name:?}: a DNS label (lower case letters, digits, '-', at most 63)"
        )));
    }
    let role = body
        .pointer("/spec/role")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !st.roles.exists(role) {
        return Err(ApiError::bad_request(format!("unknown role {role:?}")));
    }
    let ttl = match body.pointer("/spec/ttlSeconds") {
        None | Some(Value::Null) => Some(DEFAULT_TTL_SECONDS),
        Some(v) => match v.as_u64() {
            // Explicitly never expiring.
            Some(0) => None,
            Some(s) if s <= MAX_TTL_SECONDS => Some(s),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "spec.ttlSeconds must be between 0 (no expiry) and {MAX_TTL_SECONDS}"
                )))
            }
        },
    };
    let secret = {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut b);
        hex::encode(b)
    };
    let mut spec = json!({"role": role, "secretHash": secret_hash(&secret)});
    if let Some(s) = ttl {
        let exp = chrono::Utc::now() + chrono::Duration::seconds(s as i64);
        spec["expiresAt"] = Value::String(exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    let obj = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "APIToken",
        "metadata": {"name": name},
        "spec": spec,
    });
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .expect("APIToken is registered");
    let created = st.store.create(&rt, obj).await?;
    let mut out = Arc::unwrap_or_clone(created);
    out["status"] = json!({"token": format!("{TOKEN_PREFIX}{name}.{secret}")});
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&out).unwrap_or_default(),
    )
        .into_response())
}

#[cfg(test)]
mod tests;
