//! Redfish power metrics (prometheus-client), registered into the API's registry by
//! whoever builds `/metrics`. Labels carry actions and condition reasons, never a BMC
//! address or credential.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `On`, `Off`, `Reset`.
    pub action: String,
    /// `ok`, or the failure's condition reason (`Unreachable`, `CredentialsRefused`, ...).
    pub result: String,
}

/// The `redfish` driver's figures.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Attempts at a power operation, by action and result.
    pub attempts: Family<AttemptLabels, Counter>,
    /// Operations running or backing off now.
    pub operations_active: Gauge,
    /// Power states found changed behind bootplane's back by the poll.
    pub changes_observed: Counter,
    /// Servers whose power state the poll read.
    pub polls: Counter,
    /// Poll answers dropped because the Server changed while the BMC was asked.
    pub stale_observations: Counter,
}

impl Metrics {
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_redfish");
        r.register(
            "power_attempts",
            "attempts at a power operation through a BMC, by action and result",
            self.attempts.clone(),
        );
        r.register(
            "power_operations_active",
            "power operations running or backing off",
            self.operations_active.clone(),
        );
        r.register(
            "power_changes_observed",
            "power states found changed outside bootplane by the poll",
            self.changes_observed.clone(),
        );
        r.register(
            "power_polls",
            "server power states read by the poll",
            self.polls.clone(),
        );
        r.register(
            "power_observations_dropped",
            "poll answers dropped because the server changed while the BMC was asked",
            self.stale_observations.clone(),
        );
    }
}
