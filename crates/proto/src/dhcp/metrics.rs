//! DHCP metrics (prometheus-client): replies by kind, drops by reason, pool
//! utilisation. [`Metrics::register`] adds them to the API's `/metrics` registry (see `serve`).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a packet got no answer.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DropReason {
    /// Could not be decoded as DHCP.
    Malformed,
    /// A reply, not a request (op != BOOTREQUEST), or unsupported hardware type.
    NotRequest,
    /// Over the per-MAC rate limit.
    RateLimited,
    /// Not for us (other server chosen, non-PXE client in proxy mode, ...).
    Ignored,
    /// No address left in the pool.
    PoolExhausted,
    /// No configured subnet for the client's network.
    NoSubnet,
    /// The lease could not be made durable (no ACK sent).
    PersistFailed,
    /// Sending the reply failed.
    SendFailed,
    /// etcd (the leases shared with other appliances) is unreachable: no new address
    /// is offered ([`super::cluster`]).
    LedgerUnavailable,
    /// Another live appliance sharing the scope owns the client ([`super::members`]).
    OtherMember,
}

impl DropReason {
    pub(crate) const ALL: [DropReason; 10] = [
        DropReason::Malformed,
        DropReason::NotRequest,
        DropReason::RateLimited,
        DropReason::Ignored,
        DropReason::PoolExhausted,
        DropReason::NoSubnet,
        DropReason::PersistFailed,
        DropReason::SendFailed,
        DropReason::LedgerUnavailable,
        DropReason::OtherMember,
    ];
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub reason: DropReason,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SubnetLabels {
    pub subnet: String,
}

/// Counters shared by the loop (cheap: atomics; clone shares them).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub received: Counter,
    pub offers: Counter,
    pub acks: Counter,
    pub naks: Counter,
    pub releases: Counter,
    pub declines: Counter,
    pub informs: Counter,
    /// Proxy replies (boot information only, yiaddr 0).
    pub proxy_replies: Counter,
    pub drops: Family<DropLabels, Counter>,
    /// Active leases per subnet.
    pub pool_used: Family<SubnetLabels, Gauge>,
    /// Dynamic pool size per subnet.
    pub pool_size: Family<SubnetLabels, Gauge>,
    /// Durable lease-log commits (one per batch with changes).
    pub commits: Counter,
    /// Granted leases not reported because the reader's channel was full ([`super::grants`]).
    pub reports_dropped: Counter,
    /// Leases shared through etcd ([`super::cluster`]): ACKs that became NAKs because
    /// another appliance's client holds the address (the compare-and-swap lost).
    pub cluster_conflicts: Counter,
    /// Lease writes to etcd that failed (unreachable, no leader, timeout).
    pub cluster_commit_failures: Counter,
    /// Renewals ACKed from the mirror, for the time their lease had left, while etcd
    /// was unreachable.
    pub cluster_degraded_acks: Counter,
    /// Listings of the scope's leases in etcd (start, watch compacted or broken).
    pub cluster_relists: Counter,
    /// ACKs and NAKs sent on behalf of a dead member ([`super::members`]).
    pub cluster_stand_ins: Counter,
    /// Live appliances sharing the scope, this one included.
    pub cluster_members: Gauge,
}

impl Metrics {
    /// Create every drop reason's counter, so `/metrics` shows zeros rather than nothing.
    pub fn init_drop_reasons(&self) {
        for reason in DropReason::ALL {
            let _ = self.drops.get_or_create(&DropLabels { reason });
        }
    }

    pub(crate) fn drop(&self, reason: DropReason) {
        self.drops.get_or_create(&DropLabels { reason }).inc();
    }

    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops.get_or_create(&DropLabels { reason }).get()
    }

    pub fn register(&self, r: &mut Registry) {
        self.register_with_prefix(r, "bootplane_dhcp");
    }

    /// Registers under `prefix` (a second scope, e.g. `bootplane_dhcp_management`).
    pub fn register_with_prefix(&self, r: &mut Registry, prefix: &str) {
        let r = r.sub_registry_with_prefix(prefix);
        r.register("received", "DHCP packets received", self.received.clone());
        r.register("offers", "DHCPOFFERs sent", self.offers.clone());
        r.register("acks", "DHCPACKs sent", self.acks.clone());
        r.register("naks", "DHCPNAKs sent", self.naks.clone());
        r.register("releases", "DHCPRELEASEs processed", self.releases.clone());
        r.register("declines", "DHCPDECLINEs processed", self.declines.clone());
        r.register("informs", "DHCPINFORMs answered", self.informs.clone());
        r.register(
            "proxy_replies",
            "proxyDHCP replies sent",
            self.proxy_replies.clone(),
        );
        r.register("drops", "packets dropped, by reason", self.drops.clone());
        r.register(
            "pool_used",
            "active leases per subnet",
            self.pool_used.clone(),
        );
        r.register(
            "pool_size",
            "dynamic pool size per subnet",
            self.pool_size.clone(),
        );
        r.register("commits", "durable lease-log commits", self.commits.clone());
        r.register(
            "reports_dropped",
            "granted leases not reported (the reader's channel was full)",
            self.reports_dropped.clone(),
        );
        r.register(
            "cluster_conflicts",
            "ACKs turned into NAKs: another appliance holds the address (etcd compare-and-swap lost)",
            self.cluster_conflicts.clone(),
        );
        r.register(
            "cluster_commit_failures",
            "lease writes to etcd that failed (unreachable, no leader, timeout)",
            self.cluster_commit_failures.clone(),
        );
        r.register(
            "cluster_degraded_acks",
            "renewals ACKed from the mirror for the time left while etcd was unreachable",
            self.cluster_degraded_acks.clone(),
        );
        r.register(
            "cluster_relists",
            "listings of the scope's leases in etcd (start, watch compacted or broken)",
            self.cluster_relists.clone(),
        );
        r.register(
            "cluster_stand_ins",
            "ACKs and NAKs sent on behalf of a dead appliance (a REQUEST that named it)",
            self.cluster_stand_ins.clone(),
        );
        r.register(
            "cluster_members",
            "live appliances sharing the scope's leases, this one included",
            self.cluster_members.clone(),
        );
    }
}
