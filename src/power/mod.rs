//! Power drivers behind one trait. `manual` asks a person (it logs the wanted state
//! and waits for `status.powerState` to be confirmed through the API); `test`
//! confirms every request at once. QEMU (a virtual BMC for tests and demos) and
//! Redfish come later, behind the same trait.

use std::sync::Arc;

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
}

pub trait PowerDriver: Send + Sync {
    fn name(&self) -> &'static str;
    /// Ask for `want` on `server` (the Server object). Must be idempotent.
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome>;
}

/// Logs the wanted state and leaves confirmation to an operator.
pub struct Manual;

impl PowerDriver for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome> {
        let name = crate::store::meta::name(server);
        tracing::info!(server = name, power = want.as_str(), "manual power driver: please set the power state and confirm with `bootplane power confirm {name} {}`", want.as_str());
        Ok(Outcome::Pending(format!(
            "waiting for an operator to power the server {} and confirm status.powerState",
            want.as_str()
        )))
    }
}

/// Confirms every request immediately.
pub struct Instant;

impl PowerDriver for Instant {
    fn name(&self) -> &'static str {
        "test"
    }
    fn set_power(&self, _server: &Value, _want: Power) -> anyhow::Result<Outcome> {
        Ok(Outcome::Done)
    }
}

/// The driver named in the config.
pub fn from_name(name: &str) -> anyhow::Result<Arc<dyn PowerDriver>> {
    match name {
        "manual" => Ok(Arc::new(Manual)),
        "test" => Ok(Arc::new(Instant)),
        other => anyhow::bail!("power driver {other:?} is not available"),
    }
}
