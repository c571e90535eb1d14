//! From a Server or a BMC object to a Redfish [`Target`]: `spec.bmcRef` → `BMC` →
//! `BMCSecret`, or an inline `spec.bmc`; the protocol's scheme and port; the per-BMC
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
            ResolveError::NoAddress(_) => "NoAddress",
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

/// The Redfish target of a BMC object.
pub fn bmc_target(store: &Store, bmc: &Value) -> Result<Target, ResolveError> {
    let name = meta::name(bmc);
    let address = bmc
        .pointer("/spec/access/ip")
        .and_then(Value::as_str)
        .or_else(|| bmc.pointer("/spec/hostname").and_then(Value::as_str))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ResolveError::NoAddress(name.to_string()))?;
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

fn target_from(
    store: &Store,
    address: &str,
    protocol: &Value,
    secret: &str,
    insecure: bool,
) -> Result<Target, ResolveError> {
    let pname = protocol.get("name").and_then(Value::as_str).unwrap_or("Redfish");
    let default_scheme = match pname {
        "Redfish" => "https",
        "RedfishLocal" | "RedfishKube" => "http",
        other => return Err(ResolveError::Protocol(other.to_string())),
    };
    let scheme = match protocol.get("scheme").and_then(Value::as_str) {
        Some(s @ ("http" | "https")) => s,
        _ => default_scheme,
    };
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
    let t = store.registry().resolve("bmcsecret").expect("bmcsecret type");
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
