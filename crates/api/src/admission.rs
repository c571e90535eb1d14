//! Admission: what a write may say beyond "this role may write this resource". Run on
//! every create, update and merge patch of an object's main part (not `/status`),
//! after authorization, before the store.
//!
//! Credentials go only where they belong:
//! - a reference to a `BMCSecret` (a Server's inline `spec.bmc.bmcSecretRef`, a BMC's
//!   `spec.bmcSecretRef`) needs `get` on that BMCSecret, when it is new or when where it
//!   sends the credentials changes (the address, Endpoint, hostname or protocol next to
//!   it). Otherwise anyone who may write Servers or BMCs could point another BMC's
//!   secret at a host of their own and receive its password;
//! - moving an Endpoint (`spec.ip`, also creating one) needs `get` on the BMCSecret of
//!   every BMC naming it (`spec.endpointRef`);
//! - plain HTTP to a BMC (`protocol.scheme: http`, or `RedfishLocal`/`RedfishKube`
//!   without `scheme: https`) and the annotation `bootplane.dev/bmc-insecure-skip-verify`
//!   are for admins only (a role with every verb on every resource), when set or changed.
//!
//! A reference left as it was is not checked again, so a controller or an operator
//! changing other fields of an object is not blocked by a reference someone else wrote.
//! Refusals are 403 naming the secret (never its content) and what would have been needed.

use serde_json::Value;

use super::authz::{Attrs, Identity, Roles};
use super::error::ApiError;
use super::state::ApiState;
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::power::redfish::{scheme_of, INSECURE_ANNOTATION};
use crate::store::Part;

const GROUP: &str = "metal.ironcore.dev";

/// The write being admitted.
pub(crate) enum Write<'a> {
    /// POST: the whole new object.
    Create(&'a Value),
    /// PUT or PATCH: the whole new object (replacing `name`), patches applied.
    Replace(&'a Value),
}

/// Where an object sends a BMCSecret's credentials.
#[derive(Debug, PartialEq)]
struct Binding {
    /// The BMCSecret's name, and the field naming it.
    secret: String,
    field: &'static str,
    /// What decides the destination (address, Endpoint, hostname, protocol), compared
    /// as a whole between the old and the new object.
    dest: Value,
    /// The credentials would travel in clear text.
    http: bool,
}

/// What a write needs beyond the role's rule for the resource.
#[derive(Debug, PartialEq)]
enum Need {
    /// `get` on this BMCSecret; the field naming it.
    GetSecret(String, &'static str),
    /// An admin; what asks for it.
    Admin(&'static str),
}

/// Admit `w` on `rt` (`ns`/`name`) by `id`, or the 403 saying why not.
pub(crate) fn admit(
    st: &ApiState,
    id: Option<&Identity>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: Option<&str>,
    w: Write<'_>,
    part: Part,
) -> Result<(), ApiError> {
    if part != Part::Main
        || rt.group != GROUP
        || !matches!(rt.plural.as_str(), "servers" | "bmcs" | "endpoints")
    {
        return Ok(());
    }
    let old = name.and_then(|n| st.store.get(rt, ns, n).ok());
    let new = match w {
        Write::Create(o) | Write::Replace(o) => o.clone(),
    };
    let old = old.as_deref();
    let mut needs = needs(&rt.plural, old, &new);
    if rt.plural == "endpoints" && endpoint_moves(old, &new) {
        needs.extend(endpoint_needs(st, meta::name(&new)));
    }
    let anon = Identity {
        user: "system:anonymous".into(),
        groups: Vec::new(),
    };
    let id = id.unwrap_or(&anon);
    for n in needs {
        check(&st.roles, id, &n)?;
    }
    Ok(())
}

fn check(roles: &Roles, id: &Identity, n: &Need) -> Result<(), ApiError> {
    let forbidden = |m: String| ApiError::new(axum::http::StatusCode::FORBIDDEN, "Forbidden", m);
    match n {
        Need::GetSecret(secret, field) => {
            let a = Attrs {
                verb: "get".into(),
                group: GROUP.into(),
                resource: "bmcsecrets".into(),
                sub: None,
                namespace: None,
                name: Some(secret.clone()),
            };
            if roles.allows(id, &a) {
                return Ok(());
            }
            Err(forbidden(format!(
                "{field} names BMCSecret {secret:?}: User {:?} cannot get resource \"bmcsecrets\" {secret:?}, so may not send its credentials anywhere",
                id.user
            )))
        }
        Need::Admin(what) => {
            if is_admin(roles, id) {
                return Ok(());
            }
            Err(forbidden(format!(
                "{what}: only an admin may set this (User {:?} is not one)",
                id.user
            )))
        }
    }
}

/// Whether `id` holds a rule of every verb on every resource (the `admin` role): asked
/// as a verb no rule names on no resource, which only such a rule allows.
fn is_admin(roles: &Roles, id: &Identity) -> bool {
    let a = Attrs {
        verb: "admit-insecure".into(),
        group: String::new(),
        resource: String::new(),
        sub: None,
        namespace: None,
        name: None,
    };
    roles.allows(id, &a)
}

/// Where `o` (a Server or a BMC) sends BMC credentials, if anywhere.
fn binding(plural: &str, o: &Value) -> Option<Binding> {
    let (b, field) = match plural {
        "servers" => (o.pointer("/spec/bmc")?, "spec.bmc.bmcSecretRef"),
        "bmcs" => (o.get("spec")?, "spec.bmcSecretRef"),
        _ => return None,
    };
    let secret = b
        .pointer("/bmcSecretRef/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let protocol = b.get("protocol").cloned().unwrap_or(Value::Null);
    let dest = match plural {
        "servers" => serde_json::json!([b.get("address"), protocol]),
        _ => serde_json::json!([
            b.pointer("/access/ip"),
            b.pointer("/endpointRef/name"),
            b.get("hostname"),
            protocol
        ]),
    };
    Some(Binding {
        secret,
        field,
        http: scheme_of(&protocol) == Ok("http"),
        dest,
    })
}

fn insecure(o: &Value) -> bool {
    o.pointer("/metadata/annotations")
        .and_then(|a| a.get(INSECURE_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true")
}

/// What writing `new` over `old` (none: a create) needs, for Servers and BMCs.
fn needs(plural: &str, old: Option<&Value>, new: &Value) -> Vec<Need> {
    let mut out = Vec::new();
    if plural != "servers" && plural != "bmcs" {
        return out;
    }
    let before = old.and_then(|o| binding(plural, o));
    if let Some(b) = binding(plural, new) {
        let changed = before.as_ref() != Some(&b);
        if changed && !b.secret.is_empty() {
            out.push(Need::GetSecret(b.secret.clone(), b.field));
        }
        if changed && b.http {
            out.push(Need::Admin(
                "plain http to a BMC (protocol.scheme http, or RedfishLocal/RedfishKube without scheme https) sends its credentials in clear text",
            ));
        }
    }
    if insecure(new) && !old.is_some_and(insecure) {
        out.push(Need::Admin(
            "the annotation bootplane.dev/bmc-insecure-skip-verify turns off TLS verification of a BMC",
        ));
    }
    out
}

/// Whether an Endpoint write sets or changes its address.
fn endpoint_moves(old: Option<&Value>, new: &Value) -> bool {
    let ip = |o: &Value| o.pointer("/spec/ip").cloned();
    let after = ip(new);
    after.as_ref().is_some_and(|a| !a.is_null()) && old.map(ip) != Some(after)
}

/// `get` on the BMCSecret of each BMC naming Endpoint `name`.
fn endpoint_needs(st: &ApiState, name: &str) -> Vec<Need> {
    let Some(t) = st.store.registry().resolve("bmc") else {
        return Vec::new();
    };
    let (bmcs, _) = st.store.list(&t, None, None);
    bmcs.filter(|b| b.pointer("/spec/endpointRef/name").and_then(Value::as_str) == Some(name))
        .filter_map(|b| {
            let s = b
                .pointer("/spec/bmcSecretRef/name")
                .and_then(Value::as_str)?;
            (!s.is_empty()).then(|| Need::GetSecret(s.to_string(), "the BMC naming this Endpoint"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(bmc: Value, annotations: Value) -> Value {
        json!({"metadata": {"name": "s", "annotations": annotations}, "spec": {"bmc": bmc, "power": "On"}})
    }

    fn inline(secret: &str, address: &str, protocol: Value) -> Value {
        json!({"address": address, "protocol": protocol, "bmcSecretRef": {"name": secret}})
    }

    #[test]
    fn new_or_redirected_references_need_the_secret_and_http_needs_an_admin() {
        let https = json!({"name": "Redfish", "port": 8443});
        let http = json!({"name": "Redfish", "scheme": "http", "port": 8000});
        let a = server(inline("victim", "10.0.0.9", https.clone()), json!({}));
        assert_eq!(
            needs("servers", None, &a),
            vec![Need::GetSecret("victim".into(), "spec.bmc.bmcSecretRef")]
        );
        // Unchanged reference, other fields changed: nothing to check.
        let mut b = a.clone();
        b["spec"]["power"] = json!("Off");
        assert_eq!(needs("servers", Some(&a), &b), vec![]);
        // Same secret, new address: checked again.
        let moved = server(inline("victim", "192.0.2.1", https.clone()), json!({}));
        assert_eq!(needs("servers", Some(&a), &moved).len(), 1);
        // Plain http, set or implied by RedfishLocal, needs an admin; https does not.
        let h = server(inline("victim", "10.0.0.9", http), json!({}));
        assert_eq!(needs("servers", Some(&a), &h).len(), 2);
        let local = server(
            inline("victim", "10.0.0.9", json!({"name": "RedfishLocal"})),
            json!({}),
        );
        assert!(needs("servers", None, &local).contains(&Need::Admin(
            "plain http to a BMC (protocol.scheme http, or RedfishLocal/RedfishKube without scheme https) sends its credentials in clear text"
        )));
        let local_tls = server(
            inline(
                "victim",
                "10.0.0.9",
                json!({"name": "RedfishLocal", "scheme": "https"}),
            ),
            json!({}),
        );
        assert_eq!(needs("servers", None, &local_tls).len(), 1);
        // The insecure annotation: when it turns true only.
        let ins = server(
            inline("victim", "10.0.0.9", https),
            json!({INSECURE_ANNOTATION: "true"}),
        );
        assert_eq!(needs("servers", Some(&a), &ins).len(), 1);
        assert_eq!(needs("servers", Some(&ins), &ins), vec![]);
        // A BMC: its access, Endpoint, hostname and protocol are the destination.
        let bmc = json!({"spec": {"access": {"ip": "10.0.0.5"}, "bmcSecretRef": {"name": "sec"},
                         "protocol": {"name": "Redfish"}}});
        assert_eq!(
            needs("bmcs", None, &bmc),
            vec![Need::GetSecret("sec".into(), "spec.bmcSecretRef")]
        );
        let mut relabelled = bmc.clone();
        relabelled["metadata"] = json!({"labels": {"a": "b"}});
        assert_eq!(needs("bmcs", Some(&bmc), &relabelled), vec![]);
        let mut via_endpoint = bmc.clone();
        via_endpoint["spec"]["endpointRef"] = json!({"name": "evil"});
        assert_eq!(needs("bmcs", Some(&bmc), &via_endpoint).len(), 1);
        // Other kinds and Servers without an inline BMC need nothing here.
        let plain = json!({"spec": {"bmcRef": {"name": "b"}}});
        assert_eq!(needs("servers", None, &plain), vec![]);
        assert_eq!(needs("serverclaims", None, &a), vec![]);
    }

    #[test]
    fn endpoint_addresses_count_as_moved_when_set_or_changed() {
        let e = |ip: Value| json!({"spec": {"macAddress": "52:54:00:00:00:01", "ip": ip}});
        assert!(endpoint_moves(None, &e(json!("10.0.0.5"))));
        assert!(endpoint_moves(
            Some(&e(json!("10.0.0.5"))),
            &e(json!("10.0.0.6"))
        ));
        assert!(!endpoint_moves(
            Some(&e(json!("10.0.0.5"))),
            &e(json!("10.0.0.5"))
        ));
        assert!(!endpoint_moves(None, &json!({"spec": {}})));
    }

    #[test]
    fn only_a_role_with_every_verb_on_every_resource_is_an_admin() {
        let roles = Roles::new(&[super::super::authz::RoleConfig {
            name: "almost".into(),
            rules: vec![super::super::authz::RuleConfig {
                verbs: vec!["*".into()],
                resources: vec!["servers".into(), "bmcsecrets".into()],
                namespaces: None,
            }],
        }])
        .unwrap();
        let id = |g: &str| Identity {
            user: "u".into(),
            groups: vec![g.into()],
        };
        assert!(is_admin(&roles, &id("admin")));
        for g in ["operator", "viewer", "agent", "almost"] {
            assert!(!is_admin(&roles, &id(g)), "{g}");
        }
        let need = Need::GetSecret("sec".into(), "spec.bmcSecretRef");
        assert!(check(&roles, &id("operator"), &need).is_ok());
        assert!(check(&roles, &id("almost"), &need).is_ok());
        let e = check(&roles, &id("viewer"), &need).unwrap_err();
        assert_eq!(e.code, axum::http::StatusCode::FORBIDDEN);
        assert!(e.message.contains("BMCSecret \"sec\""), "{}", e.message);
    }
}
