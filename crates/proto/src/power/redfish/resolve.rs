//! From a Server or a BMC object to a Redfish [`Target`]: `spec.bmcRef` → `BMC` →
//! `BMCSecret`, or an inline `spec.bmc`; a BMC's address from `spec.access.ip` or its
//! `spec.endpointRef` → `Endpoint`'s `spec.ip`; the protocol's scheme and port; the per-BMC
//! `insecure` opt-out annotation.

use serde_json::Value;

use super::INSECURE_ANNOTATION;
use crate::model::meta;
use crate::redfish::{Password, Target};
use crate::store::{secret_data, Store};

/// Why a Server's or BMC's Redfish target could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("server has neither spec.bmcRef nor spec.bmc")]
    NoBmc,
    #[error("BMC {0} not found")]
    BmcNotFound(String),
    #[error("BMC {0} has no address (spec.access.ip)")]
    NoAddress(String),
    #[error("Endpoint {0} not found")]
    EndpointNotFound(String),
    #[error("Endpoint {0} has no spec.ip")]
    EndpointNoAddress(String),
    #[error("BMCSecret {0} not found")]
    SecretNotFound(String),
    #[error("BMCSecret {0} has no {1}")]
    SecretIncomplete(String, &'static str),
    #[error("BMC protocol {0:?} is not a Redfish one (Redfish, RedfishLocal)")]
    Protocol(String),
}

impl ResolveError {
    pub fn reason(&self) -> &'static str {
        match self {
            ResolveError::NoBmc | ResolveError::BmcNotFound(_) => "BMCNotFound",
            ResolveError::NoAddress(_) | ResolveError::EndpointNoAddress(_) => "NoAddress",
            ResolveError::EndpointNotFound(_) => "EndpointNotFound",
            ResolveError::SecretNotFound(_) => "SecretNotFound",
            ResolveError::SecretIncomplete(..) => "SecretIncomplete",
            ResolveError::Protocol(_) => "UnsupportedProtocol",
        }
    }
}

/// Whether the Server names a BMC (and so is powered by Redfish).
pub fn has_bmc(server: &Value) -> bool {
    server
        .pointer("/spec/bmcRef/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
        || server.pointer("/spec/bmc").is_some_and(Value::is_object)
}

fn annotation_true(o: &Value, key: &str) -> bool {
    o.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        == Some("true")
}

/// The address of a BMC object: `spec.access.ip`, else its Endpoint's `spec.ip`
/// (`spec.endpointRef`), else `spec.hostname`.
fn bmc_address(store: &Store, bmc: &Value) -> Result<String, ResolveError> {
    let name = meta::name(bmc);
    let non_empty = |p: &str| {
        bmc.pointer(p)
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
    };
    if let Some(ip) = non_empty("/spec/access/ip") {
        return Ok(ip);
    }
    if let Some(ep) = non_empty("/spec/endpointRef/name") {
        let t = store.registry().resolve("endpoint").expect("endpoint type");
        let e = store
            .get(&t, None, &ep)
            .map_err(|_| ResolveError::EndpointNotFound(ep.clone()))?;
        return e
            .pointer("/spec/ip")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .ok_or(ResolveError::EndpointNoAddress(ep));
    }
    non_empty("/spec/hostname").ok_or_else(|| ResolveError::NoAddress(name.to_string()))
}

/// The Redfish target of a BMC object.
pub fn bmc_target(store: &Store, bmc: &Value) -> Result<Target, ResolveError> {
    let address = bmc_address(store, bmc)?;
    let address = address.as_str();
    let secret = bmc
        .pointer("/spec/bmcSecretRef/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    target_from(
        store,
        address,
        bmc.pointer("/spec/protocol").unwrap_or(&Value::Null),
        secret,
        annotation_true(bmc, INSECURE_ANNOTATION),
    )
}

/// The BMC name (or `inline` for `spec.bmc`) and Redfish target of a Server.
pub fn server_target(store: &Store, server: &Value) -> Result<(String, Target), ResolveError> {
    if let Some(n) = server
        .pointer("/spec/bmcRef/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        let t = store.registry().resolve("bmc").expect("bmc type");
        let bmc = store
            .get(&t, None, n)
            .map_err(|_| ResolveError::BmcNotFound(n.to_string()))?;
        return Ok((n.to_string(), bmc_target(store, &bmc)?));
    }
    let b = server.pointer("/spec/bmc").ok_or(ResolveError::NoBmc)?;
    let address = b
        .get("address")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ResolveError::NoAddress(format!("inline in {}", meta::name(server))))?;
    let secret = b
        .pointer("/bmcSecretRef/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let target = target_from(
        store,
        address,
        b.get("protocol").unwrap_or(&Value::Null),
        secret,
        annotation_true(server, INSECURE_ANNOTATION),
    )?;
    Ok(("inline".into(), target))
}

/// The scheme a BMC's `protocol` resolves to: `protocol.scheme` when it is `http` or
/// `https`, else the protocol's default (`Redfish` https, `RedfishLocal` and
/// `RedfishKube` http). The API's admission check asks this too, so what it
/// refuses is what would be used.
pub fn scheme_of(protocol: &Value) -> Result<&'static str, ResolveError> {
    let pname = protocol
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("Redfish");
    let default_scheme = match pname {
        "Redfish" => "https",
        "RedfishLocal" | "RedfishKube" => "http",
        other => return Err(ResolveError::Protocol(other.to_string())),
    };
    Ok(match protocol.get("scheme").and_then(Value::as_str) {
        Some("http") => "http",
        Some("https") => "https",
        _ => default_scheme,
    })
}

fn target_from(
    store: &Store,
    address: &str,
    protocol: &Value,
    secret: &str,
    insecure: bool,
) -> Result<Target, ResolveError> {
    let scheme = scheme_of(protocol)?;
    let port = protocol
        .get("port")
        .and_then(Value::as_u64)
        .filter(|p| *p > 0 && *p < 65536)
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let host = if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address.to_string()
    };
    let t = store
        .registry()
        .resolve("bmcsecret")
        .expect("bmcsecret type");
    let s = store
        .get(&t, None, secret)
        .map_err(|_| ResolveError::SecretNotFound(secret.to_string()))?;
    let field = |k: &'static str| {
        secret_data(&s, k)
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ResolveError::SecretIncomplete(secret.to_string(), k))
    };
    Ok(Target {
        base_url: format!("{scheme}://{host}:{port}"),
        username: field("username")?,
        password: Password(field("password")?),
        insecure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn store_with(objs: &[(&str, Value)]) -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        for (t, o) in objs {
            let rt = s.registry().resolve(t).unwrap();
            s.create(&rt, o.clone()).await.unwrap();
        }
        (d, s)
    }

    fn secret(name: &str, user: &str, pass: &str) -> Value {
        json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMCSecret",
               "metadata": {"name": name}, "stringData": {"username": user, "password": pass}})
    }

    fn bmc(name: &str, ip: &str, protocol: Value, annotations: Value) -> Value {
        json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
               "metadata": {"name": name, "annotations": annotations},
               "spec": {"access": {"ip": ip}, "bmcSecretRef": {"name": "sec"}, "protocol": protocol}})
    }

    #[tokio::test]
    async fn bmc_ref_resolves_scheme_port_credentials_and_insecure() {
        let (_d, s) = store_with(&[
            ("bmcsecret", secret("sec", "admin", "pw")),
            (
                "bmc",
                bmc(
                    "a",
                    "10.0.0.5",
                    json!({"name": "Redfish", "port": 8443}),
                    json!({}),
                ),
            ),
            (
                "bmc",
                bmc(
                    "b",
                    "fd00::5",
                    json!({"name": "RedfishLocal", "port": 8000}),
                    json!({INSECURE_ANNOTATION: "true"}),
                ),
            ),
            (
                "bmc",
                bmc(
                    "c",
                    "10.0.0.6",
                    json!({"name": "Redfish", "port": 80, "scheme": "http"}),
                    json!({}),
                ),
            ),
            (
                "bmc",
                bmc(
                    "d",
                    "10.0.0.7",
                    json!({"name": "IPMI", "port": 623}),
                    json!({}),
                ),
            ),
        ])
        .await;
        let server = |b: &str| json!({"metadata": {"name": "s"}, "spec": {"bmcRef": {"name": b}}});
        let (n, t) = server_target(&s, &server("a")).unwrap();
        assert_eq!(
            (n.as_str(), t.base_url.as_str(), t.insecure),
            ("a", "https://10.0.0.5:8443", false)
        );
        assert_eq!(
            (t.username.as_str(), t.password.0.as_str()),
            ("admin", "pw")
        );
        assert!(!format!("{t:?}").contains("pw"), "the password prints");
        let (_, t) = server_target(&s, &server("b")).unwrap();
        assert_eq!(
            (t.base_url.as_str(), t.insecure),
            ("http://[fd00::5]:8000", true)
        );
        let (_, t) = server_target(&s, &server("c")).unwrap();
        assert_eq!(t.base_url, "http://10.0.0.6:80");
        assert_eq!(
            server_target(&s, &server("d")).unwrap_err().reason(),
            "UnsupportedProtocol"
        );
        assert_eq!(
            server_target(&s, &server("nope")).unwrap_err(),
            ResolveError::BmcNotFound("nope".into())
        );
        assert_eq!(
            server_target(&s, &json!({"metadata": {"name": "s"}, "spec": {}})).unwrap_err(),
            ResolveError::NoBmc
        );
    }

    #[tokio::test]
    async fn inline_bmc_and_missing_secret_parts() {
        let (_d, s) = store_with(&[("bmcsecret", secret("half", "admin", ""))]).await;
        let inline = |secret: &str| {
            json!({"metadata": {"name": "s", "annotations": {INSECURE_ANNOTATION: "true"}},
                   "spec": {"bmc": {"address": "10.1.1.1", "bmcSecretRef": {"name": secret},
                                    "protocol": {"name": "Redfish", "port": 443}}}})
        };
        assert!(has_bmc(&inline("half")));
        assert!(!has_bmc(&json!({"spec": {"bmcRef": {"name": ""}}})));
        assert_eq!(
            server_target(&s, &inline("half")).unwrap_err(),
            ResolveError::SecretIncomplete("half".into(), "password")
        );
        assert_eq!(
            server_target(&s, &inline("gone")).unwrap_err(),
            ResolveError::SecretNotFound("gone".into())
        );
    }

    #[tokio::test]
    async fn endpoint_ref_gives_the_address_and_a_missing_endpoint_says_so() {
        let by_ref = |name: &str, ep: &str| {
            json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
                   "metadata": {"name": name},
                   "spec": {"endpointRef": {"name": ep}, "bmcSecretRef": {"name": "sec"},
                            "protocol": {"name": "RedfishLocal", "port": 8000}}})
        };
        let (_d, s) = store_with(&[
            ("bmcsecret", secret("sec", "admin", "pw")),
            (
                "endpoint",
                json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Endpoint",
                       "metadata": {"name": "ep"},
                       "spec": {"ip": "10.0.0.9", "macAddress": "52:54:00:00:00:01"}}),
            ),
            (
                "endpoint",
                json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Endpoint",
                       "metadata": {"name": "noip"}, "spec": {}}),
            ),
        ])
        .await;
        let t = bmc_target(&s, &by_ref("a", "ep")).unwrap();
        assert_eq!(t.base_url, "http://10.0.0.9:8000");
        let e = bmc_target(&s, &by_ref("b", "gone")).unwrap_err();
        assert_eq!(e, ResolveError::EndpointNotFound("gone".into()));
        assert_eq!(e.reason(), "EndpointNotFound");
        assert_eq!(
            bmc_target(&s, &by_ref("c", "noip")).unwrap_err().reason(),
            "NoAddress"
        );
        // Inline spec.access wins over an endpointRef.
        let mut both = by_ref("d", "gone");
        both["spec"]["access"] = json!({"ip": "10.0.0.10"});
        assert_eq!(
            bmc_target(&s, &both).unwrap().base_url,
            "http://10.0.0.10:8000"
        );
    }
}
