//! Typed views of the metal-operator objects the BMC and discovery reconcilers read
//! (`BMC`, `Endpoint`), and [`Candidate`], the part of a Server the claim reconciler
//! keeps per server. The same rules as [`super`]: only the fields a reader
//! uses, everything optional or defaulted, unknown values of a state kept as written.
//!
//! [`read`] is how the controllers take a view of a stored object: one the store
//! accepted always reads (its schema check came first); one that does not (a
//! hand-made object in a test, a field of the wrong JSON type) reads as the empty
//! view, as the JSON-pointer readings it replaces read a missing field.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{BmcState, Condition, ObjectMeta, ObjectRef, Server, ServerPowerState, Taint};

/// The view `T` of `obj`, or the empty view when `obj` does not read as one (see the
/// module doc).
pub fn read<T: DeserializeOwned + Default>(obj: &Value) -> T {
    match T::deserialize(obj) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(error = %e, "object does not read as {}", std::any::type_name::<T>());
            T::default()
        }
    }
}

// ---- BMC ---------------------------------------------------------------------------

/// metal-operator `BMC` (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Bmc {
    pub metadata: ObjectMeta,
    pub spec: BmcSpec,
    pub status: BmcStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BmcSpec {
    pub bmc_secret_ref: Option<ObjectRef>,
    pub endpoint_ref: Option<ObjectRef>,
    /// An inline address, instead of an Endpoint.
    pub access: Option<InlineEndpoint>,
}

/// `BMC.spec.access`, a Server's inline `spec.bmc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InlineEndpoint {
    pub ip: Option<String>,
    pub mac_address: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BmcStatus {
    pub state: Option<BmcState>,
    pub power_state: Option<ServerPowerState>,
    pub ip: Option<String>,
    pub conditions: Vec<Condition>,
}

impl Bmc {
    /// The names its indexes follow: `(spec.bmcSecretRef.name, spec.endpointRef.name)`,
    /// empty when unset.
    pub fn refs(&self) -> (&str, &str) {
        (
            self.spec
                .bmc_secret_ref
                .as_ref()
                .map_or("", |r| r.name.as_str()),
            self.spec
                .endpoint_ref
                .as_ref()
                .map_or("", |r| r.name.as_str()),
        )
    }
}

// ---- Endpoint ----------------------------------------------------------------------

/// metal-operator `Endpoint` (cluster-scoped): a management MAC and its address.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Endpoint {
    pub metadata: ObjectMeta,
    pub spec: EndpointSpec,
    pub status: EndpointStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointSpec {
    pub mac_address: String,
    /// The pinned address (empty or absent: none yet).
    pub ip: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointStatus {
    /// Where the MAC's lease is, when not at the pinned address.
    #[serde(rename = "leaseIP")]
    pub lease_ip: Option<String>,
    pub conditions: Vec<Condition>,
}

// ---- Candidate ---------------------------------------------------------------------

/// What choosing a server for a claim reads of it: its labels (as JSON, what a
/// [`crate::selector::Selector`] matches) and its taints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidate {
    pub labels: Map<String, Value>,
    pub taints: Vec<Taint>,
}

impl Candidate {
    pub fn of(server: &Server) -> Candidate {
        Candidate {
            labels: (server.metadata.labels.iter())
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
            taints: server.spec.taints.clone(),
        }
    }

    pub fn labels(&self) -> Option<&Map<String, Value>> {
        Some(&self.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{ConditionStatus, TaintEffect};
    use serde_json::json;

    #[test]
    fn bmc_endpoint_and_candidate() {
        let b: Bmc = read(&json!({
            "metadata": {"name": "b1", "generation": 2, "annotations": {"a": "1"}},
            "spec": {"bmcSecretRef": {"name": "sec"}, "endpointRef": {"name": "ep"},
                     "access": {"ip": "10.0.0.9"}},
            "status": {"state": "Enabled", "powerState": "PoweringOn", "ip": "10.0.0.9"},
        }));
        assert_eq!(b.refs(), ("sec", "ep"));
        assert_eq!(b.metadata.generation, 2);
        assert_eq!(b.spec.access.unwrap().ip.as_deref(), Some("10.0.0.9"));
        assert_eq!(b.status.state, Some(BmcState::Enabled));
        assert_eq!(b.status.power_state, Some(ServerPowerState::PoweringOn));
        assert_eq!(read::<Bmc>(&json!({})).refs(), ("", ""));

        let e: Endpoint = read(&json!({
            "spec": {"macAddress": "52:54:00:00:00:01", "ip": "10.0.0.5"},
            "status": {"leaseIP": "10.0.0.6", "conditions": [
                {"type": "Pinned", "status": "False", "reason": "LeaseMoved"}]},
        }));
        assert_eq!(e.spec.ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(e.status.lease_ip.as_deref(), Some("10.0.0.6"));
        assert_eq!(e.status.conditions[0].status, ConditionStatus::False);

        let c = Candidate::of(&read(&json!({
            "metadata": {"name": "s", "labels": {"rack": "r1"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoBind"}], "power": "On"},
        })));
        assert_eq!(c.labels().unwrap()["rack"], "r1");
        assert_eq!(c.taints[0].effect, Some(TaintEffect::NoBind));

        // A field of the wrong type: the empty view, as a pointer read it as absent.
        let bad: Endpoint = read(&json!({"spec": {"ip": 7}}));
        assert_eq!(bad, Endpoint::default());
    }
}
