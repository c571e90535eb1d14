//! Power drivers behind one trait. `manual` asks a person (it logs the wanted state
//! and waits for `status.powerState` to be confirmed through the API); `test`
//! confirms every request at once; `qemu` ([`qemu`]) starts and stops a QEMU VM per
//! Server (a virtual BMC for tests and demos); `redfish` ([`redfish`]) drives real
//! servers through their BMCs and is chosen per Server (those naming a BMC), so a fleet
//! mixes it with the configured driver ([`redfish::PerServer`]).

pub mod metrics;
pub mod qemu;
pub mod redfish;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use serde_json::Value;

/// The power states of the Server CRD (`spec.power` / `status.powerState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    On,
    Off,
}

impl Power {
    pub fn as_str(self) -> &'static str {
        match self {
            Power::On => "On",
            Power::Off => "Off",
        }
    }
    pub fn parse(s: &str) -> Option<Power> {
        match s {
            "On" => Some(Power::On),
            "Off" => Some(Power::Off),
            _ => None,
        }
    }
}

/// What a driver did with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The machine is now in the wanted state; the controller records it.
    Done,
    /// The request was handed on; the state will be confirmed later (an operator or
    /// a BMC poll updates `status.powerState`).
    Pending(String),
    /// The request is being retried after a failure: `(reason, message)` for the
    /// `PowerReady` condition.
    Retrying(&'static str, String),
}

pub trait PowerDriver: Send + Sync {
    fn name(&self) -> &'static str;
    /// The driver that acts on this Server (differs from [`PowerDriver::name`] when
    /// the driver is chosen per Server).
    fn name_for(&self, _server: &Value) -> &'static str {
        self.name()
    }
    /// Ask for `want` on `server` (the Server object). Must be idempotent.
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome>;
    /// Restart `server` (start it when it is off), with its one-time network boot.
    fn reset(&self, server: &Value) -> anyhow::Result<Outcome> {
        anyhow::bail!(
            "the {} power driver cannot reset a server",
            self.name_for(server)
        )
    }
}

/// Logs the wanted state and leaves confirmation to an operator.
pub(crate) struct Manual;

impl PowerDriver for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome> {
        let name = crate::model::meta::name(server);
        tracing::info!(server = name, power = want.as_str(), "manual power driver: please set the power state and confirm with `bootplane power confirm {name} {}`", want.as_str());
        Ok(Outcome::Pending(format!(
            "waiting for an operator to power the server {} and confirm status.powerState",
            want.as_str()
        )))
    }
}

/// Confirms every request immediately.
pub(crate) struct Instant;

impl PowerDriver for Instant {
    fn name(&self) -> &'static str {
        "test"
    }
    fn set_power(&self, _server: &Value, _want: Power) -> anyhow::Result<Outcome> {
        Ok(Outcome::Done)
    }
}

/// `[power]`: settings of the drivers that need any (the default driver is chosen by
/// `controller.power_driver`; Servers naming a BMC use `redfish`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PowerConfig {
    pub qemu: qemu::QemuConfig,
    pub redfish: redfish::RedfishConfig,
}

/// The driver named `driver` (`controller.power_driver`), built from its `[power.*]`
/// section of `c` (the QEMU driver keeps its VMs under `state_dir`).
pub fn from_config(
    driver: &str,
    c: &PowerConfig,
    state_dir: &std::path::Path,
) -> anyhow::Result<Arc<dyn PowerDriver>> {
    match driver {
        "qemu" => Ok(qemu::Qemu::new(c.qemu.clone(), state_dir)?),
        other => from_name(other),
    }
}

/// The driver named in the config (drivers without settings).
pub(crate) fn from_name(name: &str) -> anyhow::Result<Arc<dyn PowerDriver>> {
    match name {
        "manual" => Ok(Arc::new(Manual)),
        "test" => Ok(Arc::new(Instant)),
        other => anyhow::bail!("power driver {other:?} is not available"),
    }
}
