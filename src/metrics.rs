//! What the API's `/metrics` exports: the one list of the services' metric families,
//! registered by `serve` with the handles it built, and by `tests/tidy.rs`, which checks
//! every metric name the docs mention against it. A new family is registered here once.
//!
//! The audit log's families (`bootplane_api_audit_*`) are registered by
//! `api::audit::Audit::start`, which the API's registry is handed to.

use prometheus_client::registry::Registry;

use crate::controller::discovery::endpoints::Metrics as EndpointMetrics;
use crate::power::metrics::Metrics as PowerMetrics;
use crate::power::redfish::metrics::Metrics as RedfishMetrics;
#[cfg(feature = "etcd")]
use crate::store::etcd::election::Metrics as LeaderMetrics;

/// The prefix of the management DHCP scope's families (`[discovery.dhcp]`).
pub const MANAGEMENT_DHCP_PREFIX: &str = "bootplane_dhcp_management";

/// The prefix of the API listener's families (connections, audit).
pub const API_PREFIX: &str = "bootplane_api";

/// The services' metric handles. The store's, the controllers', the provisioning jobs'
/// and the events' are process-wide and registered from their globals.
pub struct Families<'a> {
    pub http: &'a crate::http::Metrics,
    /// Registered whether or not the service is on, so a scrape config does not depend
    /// on this appliance's: a disabled service's counters stay at zero.
    pub dhcp: &'a crate::dhcp::Metrics,
    pub tftp: &'a crate::tftp::Metrics,
    /// `bootplane_power_requests_total` (every driver).
    pub power: &'a PowerMetrics,
    /// `bootplane_store_secrets_by_key{key}` (key rotation, secrets at rest).
    pub seal: &'a crate::store::rotate::Metrics,
    /// The management DHCP scope's and the Endpoint intake's, when discovery manages
    /// BMCs (`[discovery.dhcp]`).
    pub management: Option<(&'a crate::dhcp::Metrics, &'a EndpointMetrics)>,
    /// The Redfish client's, when the controllers run.
    pub redfish: Option<&'a RedfishMetrics>,
    /// `bootplane_store_leader{group}` with these groups declared, when the controllers
    /// run on etcd.
    #[cfg(feature = "etcd")]
    pub leader: Option<(&'a LeaderMetrics, &'a [&'a str])>,
}

/// Registers every family of `f` (and the process-wide ones) into `reg`, and returns
/// the API listener's connection metrics, registered under [`API_PREFIX`].
pub fn register(reg: &mut Registry, f: Families<'_>) -> crate::listen::ConnMetrics {
    f.http.register(reg);
    f.dhcp.register(reg);
    f.tftp.register(reg);
    crate::store::metrics::global().register(reg);
    crate::controller::runtime::metrics::global().register(reg);
    crate::provision::metrics::global().register(reg);
    f.power.register(reg);
    if let Some((dhcp, endpoints)) = f.management {
        dhcp.register_with_prefix(reg, MANAGEMENT_DHCP_PREFIX);
        endpoints.register(reg);
    }
    if let Some(redfish) = f.redfish {
        redfish.register(reg);
    }
    #[cfg(feature = "etcd")]
    if let Some((leader, groups)) = f.leader {
        leader.register(reg);
        for group in groups {
            leader.declare(group);
        }
    }
    f.seal.register(reg);
    crate::store::events::register_metrics(reg);
    let api_conns = crate::listen::ConnMetrics::default();
    api_conns.register(reg.sub_registry_with_prefix(API_PREFIX));
    api_conns
}
