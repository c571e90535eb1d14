//! Typed, read-only views of the objects the controllers read: metal-operator's
//! `Server`, `ServerClaim` and `ServerBootConfiguration` (`metal.ironcore.dev/v1alpha1`)
//! and bootplane's `BareMetalServer` (`provisioning.bootplane.dev/v1alpha1`).
//!
//! A view holds only the fields some reader uses (everything else in the object is
//! ignored), each optional or defaulted as the CRD allows, so any object the store
//! accepted deserializes: `view::<Server>(&obj)`. States are enums whose unknown values
//! are kept as written (`Other`), never an error. Views are for reading: writers keep
//! patching the stored JSON, so fields a view does not know are never dropped.
//!
//! [`nics`] / [`Nic`] are the one reading of a Server's network interfaces (boot index,
//! Ignition facts, DHCP reservations, power).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::ident::{parse_mac, Mac};
use super::selector::Selector;

pub mod metal;
pub use metal::{read, Bmc, Candidate, Endpoint};

/// Read the view `T` of a stored object (borrows it; no copy of the JSON).
pub fn view<T: DeserializeOwned>(obj: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(obj)
}

/// A string-valued field with the values bootplane knows as variants; any other value
/// is kept as written in `Other`.
#[macro_export]
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $var,)+
            /// A value bootplane does not know, as written.
            Other(String),
        }

        impl $name {
            /// The values bootplane knows, as written (the variants but `Other`).
            #[allow(dead_code)]
            pub(crate) const VALUES: &'static [&'static str] = &[$(stringify!($var)),+];

            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$var => stringify!($var),)+
                    $name::Other(s) => s,
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $(stringify!($var) => $name::$var,)+
                    o => $name::Other(o.to_string()),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                Ok($name::from(&*s))
            }
        }
    };
}
/// Also used by the controllers for the states of the objects they write.
pub use crate::string_enum;

string_enum! {
    /// `Server.status.state` (no state yet is `None`). `Cleanup` is metal-operator's
    /// designed state between a released claim and `Available` (its disks are wiped).
    ServerState { Initial, Discovery, Available, Reserved, Released, Error, Maintenance, Cleanup }
}

string_enum! {
    /// `Server.spec.power`, `ServerClaim.spec.power`; also how `Server.status.powerState`
    /// is read (its transitional values, [`ServerPowerState`], read as `Other`).
    PowerState { On, Off }
}

string_enum! {
    /// `Server.status.powerState` and `BMC.status.powerState` (metal-operator's
    /// `ServerPowerState` and `BMCPowerState`: Redfish's `PowerState` values).
    ServerPowerState { On, Off, Paused, PoweringOn, PoweringOff }
}

string_enum! {
    /// `BMC.status.state` (metal-operator's `BMCState`).
    BmcState { Enabled, Error, Pending }
}

string_enum! {
    /// `Server.spec.reclaimPolicy` (absent means `Recycle`).
    ReclaimPolicy { Recycle, Retain }
}

string_enum! {
    /// A taint's or toleration's `effect` (absent means `NoBind`).
    TaintEffect { NoBind, Evict }
}

string_enum! {
    /// A toleration's `operator` (absent means `Equal`).
    TolerationOperator { Equal, Exists }
}

string_enum! {
    /// `ServerClaim.status.phase`.
    ClaimPhase { Bound, Unbound }
}

string_enum! {
    /// `ServerBootConfiguration.status.state`.
    BootConfigurationState { Pending, Ready, Error }
}

string_enum! {
    /// `BareMetalServer.status.state`.
    BareMetalServerState { Pending, Provisioning, Provisioned, Failed, Deprovisioning }
}

string_enum! {
    /// A condition's `status`.
    ConditionStatus { True, False, Unknown }
}

/// The `metadata` fields readers use.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: String,
    pub resource_version: Option<String>,
    pub generation: i64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub finalizers: Vec<String>,
    pub deletion_timestamp: Option<String>,
    pub owner_references: Vec<OwnerReference>,
}

impl ObjectMeta {
    /// The namespace, `default` when the object has none.
    pub fn namespace_or_default(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
    pub fn is_deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<bool>,
}

/// A reference by name (`serverRef`, `ignitionSecretRef`, ...), with the namespace where
/// the reference carries one (`serverClaimRef`, `bootConfigurationRef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ObjectRef {
    pub name: String,
    pub namespace: Option<String>,
}

impl ObjectRef {
    /// `(namespace, name)`, the namespace `default` when the reference has none.
    pub fn key(&self) -> (String, String) {
        (
            self.namespace.as_deref().unwrap_or("default").to_string(),
            self.name.clone(),
        )
    }
}

/// One entry of `status.conditions`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: Option<String>,
    #[serde(default)]
    pub observed_generation: Option<i64>,
}

/// The condition of type `ty` in a list of conditions.
pub fn condition<'a>(conditions: &'a [Condition], ty: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == ty)
}

// ---- Server ------------------------------------------------------------------------

/// metal-operator `Server` (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Server {
    pub metadata: ObjectMeta,
    pub spec: ServerSpec,
    pub status: ServerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerSpec {
    #[serde(rename = "systemUUID")]
    pub system_uuid: Option<String>,
    /// The wanted power (the claim reconciler keeps it in step with the claim).
    pub power: Option<PowerState>,
    pub server_claim_ref: Option<ObjectRef>,
    pub boot_configuration_ref: Option<ObjectRef>,
    pub unclaimable: bool,
    pub taints: Vec<Taint>,
    pub reclaim_policy: Option<ReclaimPolicy>,
    pub bmc_ref: Option<ObjectRef>,
    /// An inline BMC (only whether there is one is read).
    pub bmc: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerStatus {
    pub state: Option<ServerState>,
    pub power_state: Option<PowerState>,
    pub network_interfaces: Vec<NetworkInterface>,
    pub conditions: Vec<Condition>,
}

/// One entry of `Server.status.networkInterfaces`, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NetworkInterface {
    pub name: String,
    pub mac_address: String,
    pub ips: Vec<String>,
    /// Deprecated single address (read after `ips`).
    pub ip: Option<String>,
}

impl NetworkInterface {
    pub fn nic(&self) -> Nic {
        Nic::read(
            Some(&self.mac_address),
            self.ips.iter().chain(&self.ip).map(String::as_str),
        )
    }
}

impl Server {
    /// The server's NICs, in order (see [`nics`]).
    pub fn nics(&self) -> Vec<Nic> {
        self.status
            .network_interfaces
            .iter()
            .map(NetworkInterface::nic)
            .collect()
    }
    /// The claim bound to the server, `(namespace, name)`.
    pub fn claim_key(&self) -> Option<(String, String)> {
        self.spec.server_claim_ref.as_ref().map(ObjectRef::key)
    }
}

/// One entry of a Server's `status.networkInterfaces`: its MAC (when present and
/// well-formed) and its addresses (`ips[]`, then the deprecated `ip`), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub mac: Option<Mac>,
    pub ips: Vec<IpAddr>,
}

impl Nic {
    /// From a `macAddress` ([`super::ident`]'s grammar, surrounding blanks allowed)
    /// and addresses; malformed ones are left out.
    fn read<'a>(mac: Option<&str>, ips: impl IntoIterator<Item = &'a str>) -> Nic {
        Nic {
            mac: mac.and_then(|m| parse_mac(m.trim()).ok()),
            ips: ips.into_iter().filter_map(|a| a.parse().ok()).collect(),
        }
    }
}

/// The network interfaces a Server object reports. Every reader of a Server's MACs
/// and addresses (boot index, Ignition facts, DHCP reservations) goes through this.
/// Reads the JSON directly, so one malformed interface costs only itself.
pub fn nics(server: &Value) -> Vec<Nic> {
    server
        .pointer("/status/networkInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|nic| {
            Nic::read(
                nic.get("macAddress").and_then(Value::as_str),
                nic.get("ips")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .chain(nic.get("ip"))
                    .filter_map(Value::as_str),
            )
        })
        .collect()
}

// ---- ServerClaim -------------------------------------------------------------------

/// metal-operator `ServerClaim` (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServerClaim {
    pub metadata: ObjectMeta,
    pub spec: ServerClaimSpec,
    pub status: ServerClaimStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerClaimSpec {
    pub image: String,
    pub power: Option<PowerState>,
    pub server_ref: Option<ObjectRef>,
    /// A `metav1.LabelSelector`, as written; [`ServerClaim::selector`] parses it.
    pub server_selector: Option<Value>,
    pub ignition_secret_ref: Option<ObjectRef>,
    pub tolerations: Vec<Toleration>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Toleration {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<TolerationOperator>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServerClaimStatus {
    pub phase: Option<ClaimPhase>,
}

impl ServerClaim {
    /// The claim's server selector; `None` when it has none (any server).
    pub fn selector(&self) -> Result<Option<Selector>, String> {
        match &self.spec.server_selector {
            Some(s) if !s.is_null() => Selector::from_label_selector(s).map(Some),
            _ => Ok(None),
        }
    }
}

// ---- ServerBootConfiguration -------------------------------------------------------

/// metal-operator `ServerBootConfiguration` (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServerBootConfiguration {
    pub metadata: ObjectMeta,
    pub spec: ServerBootConfigurationSpec,
    pub status: ServerBootConfigurationStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerBootConfigurationSpec {
    pub server_ref: ObjectRef,
    pub image: String,
    pub ignition_secret_ref: Option<ObjectRef>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServerBootConfigurationStatus {
    pub state: Option<BootConfigurationState>,
    pub conditions: Vec<Condition>,
}

impl ServerBootConfiguration {
    /// `<uid>/<generation>`: what signed boot tokens are bound to.
    pub fn boot_id(&self) -> String {
        format!("{}/{}", self.metadata.uid, self.metadata.generation)
    }
}

// ---- BareMetalServer ---------------------------------------------------------------

/// bootplane `BareMetalServer` (namespaced; projected from a BareMetalSpec).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct BareMetalServer {
    pub metadata: ObjectMeta,
    pub spec: BareMetalServerSpec,
    pub status: BareMetalServerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BareMetalServerSpec {
    /// The disk to write, as the job runner names it.
    pub target: String,
    /// The address the provisioning job's NFS client comes from (else the configured one).
    pub job_address: Option<String>,
    pub description: Option<String>,
    pub bare_metal_spec_ref: Option<ObjectRef>,
    /// Recorded by the server controller from the image's StorageVolume.
    pub nfs: Option<NfsDetails>,
    pub export_policy_rule_ref: Option<ObjectRef>,
    pub action_ref: Option<ObjectRef>,
}

/// Where a provisioning job reads its image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NfsDetails {
    pub server: String,
    pub export: String,
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BareMetalServerStatus {
    pub state: Option<BareMetalServerState>,
    pub message: String,
    pub progress: Option<Progress>,
    pub image_ref: Option<ObjectRef>,
    pub conditions: Vec<Condition>,
}

/// A provisioning job's progress, as mirrored into the server's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Progress {
    pub bytes: Option<u64>,
    pub total: Option<u64>,
    pub rate: Option<u64>,
    pub stage: Option<String>,
    pub percent: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    fn yaml(text: &str) -> Value {
        serde_norway::from_str(text).unwrap()
    }

    /// `obj` is valid for the type's schema, defaults applied (bootplane's constraints
    /// are not applied: views also read objects stored before those existed).
    fn valid(kind: &str, mut obj: Value) -> Value {
        let t = Registry::global().resolve(kind).unwrap();
        let schema = t.schema.as_ref().unwrap();
        schema.apply_defaults(&mut obj);
        let mut errs = Vec::new();
        schema.validate("", &obj, None, &mut errs);
        assert!(errs.is_empty(), "{kind}: {errs:?}");
        obj
    }

    #[test]
    fn metal_operator_samples() {
        let s: Server = view(&yaml(include_str!(
            "../../../tests/fixtures/metal-operator/metal_v1alpha1_server.yaml"
        )))
        .unwrap();
        assert_eq!(s.metadata.name, "endpoint-sample-system-0");
        assert_eq!(s.metadata.labels["app.kubernetes.io/name"], "server");
        assert_eq!(
            s.spec.system_uuid.as_deref(),
            Some("00000000-0000-0000-0000-000000000001")
        );
        assert_eq!(s.status, ServerStatus::default());
        assert!(s.nics().is_empty() && s.claim_key().is_none());

        let c: ServerClaim = view(&yaml(include_str!(
            "../../../tests/fixtures/metal-operator/metal_v1alpha1_serverclaim.yaml"
        )))
        .unwrap();
        assert_eq!(c.metadata.namespace_or_default(), "default");
        assert_eq!(
            c.spec.server_ref.as_ref().map(|r| r.name.as_str()),
            Some("endpoint-sample-system-0")
        );
        assert_eq!(c.spec.image, "os-image:latest");
        assert_eq!(c.spec.power, Some(PowerState::On));
        assert_eq!(
            c.spec.ignition_secret_ref.as_ref().unwrap().name,
            "ignition-sample"
        );
        assert!(c.selector().unwrap().is_none());

        let b: ServerBootConfiguration = view(&yaml(include_str!(
            "../../../tests/fixtures/metal-operator/metal_v1alpha1_serverbootconfiguration.yaml"
        )))
        .unwrap();
        assert_eq!(b.spec.server_ref.name, "server-sample");
        assert_eq!(b.spec.image, "os-image:latest");
        assert_eq!(b.spec.ignition_secret_ref.unwrap().name, "my-ignition");
        assert_eq!(b.status.state, None);
    }

    #[test]
    fn server_as_the_controllers_see_it() {
        let obj = valid(
            "Server",
            json!({
                "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                "metadata": {"name": "s1", "uid": "u-1", "resourceVersion": "7",
                             "labels": {"rack": "r1"},
                             "annotations": {"bootplane.dev/firmware": "uefi"},
                             "finalizers": ["f"], "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"systemUUID": "4C4C4544-0042-3510-8052-B4C04F4E4D32", "power": "On",
                         "serverClaimRef": {"name": "c1", "namespace": "team"},
                         "bootConfigurationRef": {"name": "c1", "namespace": "team"},
                         "taints": [{"key": "gpu", "value": "yes", "effect": "NoBind"}, {"key": "x"}],
                         "reclaimPolicy": "Retain"},
                "status": {"state": "Reserved", "powerState": "Off",
                           "networkInterfaces": [
                               {"name": "eth0", "macAddress": " 52:54:00:AB:cd:01 ",
                                "ips": ["fe80::1", "10.0.0.5", "not-an-ip"], "ip": "10.0.0.6"},
                               {"name": "eth1", "macAddress": "52:54:0:ab:cd:02", "ip": "10.0.1.5"}],
                           "conditions": [{"type": "PowerReady", "status": "True", "reason": "Applied",
                                           "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }),
        );
        let s: Server = view(&obj).unwrap();
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(s.metadata.annotations["bootplane.dev/firmware"], "uefi");
        assert!(s.metadata.is_deleting());
        assert_eq!(s.spec.power, Some(PowerState::On));
        assert_eq!(s.claim_key(), Some(("team".into(), "c1".into())));
        assert_eq!(s.spec.boot_configuration_ref.as_ref().unwrap().name, "c1");
        assert!(!s.spec.unclaimable);
        assert_eq!(s.spec.taints[0].effect, Some(TaintEffect::NoBind));
        // The CRD defaults a taint's effect; a view of an object that skipped the
        // defaults (a hand-made one) has none.
        assert_eq!(s.spec.taints[1].effect, Some(TaintEffect::NoBind));
        assert_eq!(s.spec.reclaim_policy, Some(ReclaimPolicy::Retain));
        assert_eq!(s.status.state, Some(ServerState::Reserved));
        assert_eq!(s.status.power_state, Some(PowerState::Off));
        let c = condition(&s.status.conditions, "PowerReady").unwrap();
        assert_eq!(
            (c.status.clone(), c.reason.as_str()),
            (ConditionStatus::True, "Applied")
        );
        // The typed and the JSON reading of the NICs agree: a malformed MAC is left
        // out but its addresses are kept; `ips` first, then `ip`.
        let want = vec![
            Nic {
                mac: Some([0x52, 0x54, 0, 0xab, 0xcd, 1]),
                ips: ["fe80::1", "10.0.0.5", "10.0.0.6"]
                    .map(|a| a.parse().unwrap())
                    .to_vec(),
            },
            Nic {
                mac: None,
                ips: vec!["10.0.1.5".parse().unwrap()],
            },
        ];
        assert_eq!(s.nics(), want);
        assert_eq!(nics(&obj), want);
    }

    #[test]
    fn cleared_refs_and_unknown_states() {
        let s: Server = view(&json!({
            "spec": {"serverClaimRef": null, "bootConfigurationRef": null},
            "status": {"state": "Parked", "powerState": "Paused"},
        }))
        .unwrap();
        assert!(s.claim_key().is_none() && s.spec.boot_configuration_ref.is_none());
        let t: Server = view(&json!({"spec": {"taints": [{"key": "x"}]}})).unwrap();
        assert_eq!(t.spec.taints[0].effect, None);
        assert_eq!(s.status.state, Some(ServerState::Other("Parked".into())));
        assert_eq!(s.status.state.unwrap().as_str(), "Parked");
        assert_eq!(s.status.power_state.unwrap().to_string(), "Paused");
        assert_eq!(
            serde_json::to_value(ServerState::Available).unwrap(),
            json!("Available")
        );
        // An empty object is a view with nothing set.
        assert_eq!(view::<Server>(&json!({})).unwrap(), Server::default());
        assert_eq!(
            view::<BareMetalServer>(&json!({})).unwrap(),
            BareMetalServer::default()
        );
    }

    #[test]
    fn claim_selector_and_tolerations() {
        let obj = valid(
            "ServerClaim",
            json!({
                "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                "metadata": {"name": "c1", "namespace": "team"},
                "spec": {"image": "img", "power": "Off",
                         "serverSelector": {"matchLabels": {"rack": "r1"},
                                            "matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]},
                         "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                "status": {"phase": "Unbound"},
            }),
        );
        let c: ServerClaim = view(&obj).unwrap();
        let sel = c.selector().unwrap().unwrap();
        let labels = json!({"rack": "r1"});
        assert!(sel.matches(labels.as_object()));
        let labels = json!({"rack": "r1", "gpu": "1"});
        assert!(!sel.matches(labels.as_object()));
        assert_eq!(
            c.spec.tolerations[0].operator,
            Some(TolerationOperator::Exists)
        );
        assert_eq!(c.spec.tolerations[0].key.as_deref(), Some("gpu"));
        assert_eq!(c.status.phase, Some(ClaimPhase::Unbound));
        assert_eq!(c.metadata.namespace_or_default(), "team");
    }

    #[test]
    fn boot_configuration_status() {
        let obj = valid(
            "ServerBootConfiguration",
            json!({
                "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerBootConfiguration",
                "metadata": {"name": "c1", "namespace": "team", "uid": "u-9", "generation": 3,
                             "ownerReferences": [{"apiVersion": "metal.ironcore.dev/v1alpha1",
                                                  "kind": "ServerClaim", "name": "c1", "uid": "u-1",
                                                  "controller": true}]},
                "spec": {"serverRef": {"name": "s1"}, "image": "img"},
                "status": {"state": "Error", "conditions": [
                    {"type": "Ready", "status": "False", "reason": "NoImage",
                     "message": "spec.image is empty", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }),
        );
        let b: ServerBootConfiguration = view(&obj).unwrap();
        assert_eq!(b.boot_id(), "u-9/3");
        assert_eq!(b.metadata.owner_references[0].uid, "u-1");
        assert_eq!(b.metadata.owner_references[0].controller, Some(true));
        assert_eq!(b.status.state, Some(BootConfigurationState::Error));
        assert_eq!(
            condition(&b.status.conditions, "Ready").map(|c| c.message.as_str()),
            Some("spec.image is empty")
        );
        assert!(b.spec.ignition_secret_ref.is_none());
    }

    #[test]
    fn bare_metal_server_as_projected_and_provisioned() {
        let obj = valid(
            "BareMetalServer",
            json!({
                "apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "BareMetalServer",
                "metadata": {"name": "m1", "namespace": "default",
                             "labels": {"provisioning.bootplane.dev/image-id": "rhcos"},
                             "finalizers": ["provisioning.bootplane.dev/server"]},
                "spec": {"bareMetalSpecRef": {"name": "m1"}, "target": "/dev/dasda",
                         "jobAddress": "10.0.0.9",
                         "nfs": {"server": "10.0.0.1", "export": "/images/default/rhcos", "path": "rhcos.raw"},
                         "exportPolicyRuleRef": {"name": "m1-provision"},
                         "actionRef": {"name": "m1-provision"}},
                "status": {"state": "Provisioning", "message": "writing",
                           "progress": {"bytes": 10, "total": 100, "rate": 5, "stage": "write", "percent": 10},
                           "imageRef": {"name": "rhcos"},
                           "conditions": [{"type": "Provisioned", "status": "False"}]},
            }),
        );
        let m: BareMetalServer = view(&obj).unwrap();
        assert_eq!(
            m.metadata.labels["provisioning.bootplane.dev/image-id"],
            "rhcos"
        );
        assert_eq!(m.spec.target, "/dev/dasda");
        assert_eq!(m.spec.job_address.as_deref(), Some("10.0.0.9"));
        assert_eq!(m.spec.bare_metal_spec_ref.unwrap().name, "m1");
        assert_eq!(
            m.spec.nfs,
            Some(NfsDetails {
                server: "10.0.0.1".into(),
                export: "/images/default/rhcos".into(),
                path: "rhcos.raw".into(),
            })
        );
        assert_eq!(m.spec.action_ref.unwrap().name, "m1-provision");
        assert_eq!(m.spec.export_policy_rule_ref.unwrap().name, "m1-provision");
        assert_eq!(m.status.state, Some(BareMetalServerState::Provisioning));
        assert_eq!(m.status.progress.unwrap().percent, Some(10));
        assert_eq!(m.status.image_ref.unwrap().name, "rhcos");
        let c = condition(&m.status.conditions, "Provisioned").unwrap();
        assert_eq!(
            (c.status.clone(), c.reason.as_str()),
            (ConditionStatus::False, "")
        );
    }
}
