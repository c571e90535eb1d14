//! What a caller may do: the [`Identity`] authentication found, the [`Attrs`] of a
//! request (verb, API group, resource, namespace, name, derived as kube does) and the
//! [`Roles`] (rules of verbs × resources, kube's RBAC without bindings: a caller's groups
//! that name a role grant it). No I/O: `auth`'s middleware asks [`Roles::allows`].

use axum::http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ApiError;
use super::tokens::{valid_token_name, TOKENS};
use crate::model::registry::Registry;

/// The authenticated caller, inserted as a request extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub user: String,
    /// A group named like a role grants that role.
    pub groups: Vec<String>,
}

/// The verbs of a rule, as kube derives them from the method, the path and `watch`.
pub(crate) const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Names of API routes that are not stored resources, each with its API group
/// (empty: no group).
pub(crate) const NON_RESOURCES: [(&str, &str); 5] = [
    ("metrics", ""),
    ("discovery", ""),
    ("leases", "dhcp.bootplane.dev"),
    ("jobs", "bootplane.dev"),
    ("render", "boot.bootplane.dev"),
];

/// What a request asks to do, derived from its method, path and query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attrs {
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
    pub(crate) fn derive(method: &Method, path: &str, query: Option<&str>) -> Attrs {
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
            // What every client reads first ([`super::discovery`]).
            ["apis"]
            | ["api"]
            | ["version"]
            | ["api", _]
            | ["apis", _]
            | ["apis", _, _]
            | ["openapi", ..] => {
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
    pub(crate) fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete")
    }

    /// `resource[/sub]`, as the audit log and rules name it.
    pub(crate) fn resource_path(&self) -> String {
        match &self.sub {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// kube's forbidden message: `servers.metal.ironcore.dev "a" is forbidden: User "x"
    /// cannot delete resource "servers" in API group "metal.ironcore.dev" at the
    /// cluster scope`.
    pub(crate) fn forbidden(&self, user: &str) -> ApiError {
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
    /// As configured, for `SelfSubjectRulesReview`.
    config: RuleConfig,
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
            config: c.clone(),
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

    pub(crate) fn exists(&self, name: &str) -> bool {
        self.roles.iter().any(|(n, _)| n == name)
    }

    /// The rules, as configured, of every role named by one of `id`'s groups
    /// (`SelfSubjectRulesReview`).
    pub(crate) fn rules_of(&self, id: &Identity) -> Vec<&RuleConfig> {
        (self.roles.iter())
            .filter(|(n, _)| id.groups.iter().any(|g| g == n))
            .flat_map(|(_, rules)| rules.iter().map(|r| &r.config))
            .collect()
    }

    /// Whether any role named by one of `id`'s groups allows `a`.
    pub(crate) fn allows(&self, id: &Identity, a: &Attrs) -> bool {
        self.roles
            .iter()
            .filter(|(n, _)| id.groups.iter().any(|g| g == n))
            .any(|(_, rules)| rules.iter().any(|r| r.allows(a)))
    }
}
