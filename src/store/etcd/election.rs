//! One leader per controller group among the appliances sharing an etcd cluster,
//! through etcd's election API (`{prefix}election/{group}`) on a lease of
//! `lease_ttl_secs`.
//!
//! [`Election::campaign`] resolves once this appliance leads the group, with a
//! [`Leadership`]: its [`Fence`] (the leader key and the revision it was created at;
//! every write of the group's controllers requires it, see [`super`]) and a signal
//! that fires when the lease can no longer be renewed. The lease is renewed every
//! third of its TTL; leadership counts as lost when no renewal succeeded for two
//! thirds of the TTL, or etcd says the lease is gone, so the controllers stop before
//! another appliance can be elected, and the fence refuses whatever a paused
//! leader still sends after that.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use super::Fence;
use crate::store::settings::EtcdConfig;

/// Label of [`Metrics::leader`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: String,
}

/// `bootplane_store_leader{group}`: 1 while this appliance leads the group.
#[derive(Clone, Default)]
pub struct Metrics {
    pub leader: Family<GroupLabel, Gauge>,
}

impl Metrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "bootplane_store_leader",
            "1 while this appliance leads the controller group (etcd backend)",
            self.leader.clone(),
        );
    }

    /// Export the group's series (0) before any election ends.
    pub fn declare(&self, group: &str) {
        self.leader.get_or_create(&GroupLabel { group: group.into() }).set(0);
    }

    pub fn set(&self, group: &str, leading: bool) {
        self.leader
            .get_or_create(&GroupLabel { group: group.into() })
            .set(leading as i64);
    }
}

/// The election of one controller group.
pub struct Election {
    client: etcd_client::Client,
    name: String,
    member: String,
    ttl: Duration,
    pub group: &'static str,
}

/// This appliance's term as leader of a group.
pub struct Leadership {
    pub fence: Fence,
    lease: i64,
    lost: CancellationToken,
    renew: tokio::task::JoinHandle<()>,
    client: etcd_client::Client,
}

impl Leadership {
    /// Resolves when the lease could not be renewed in time (see the module doc).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Give the leadership up (revoke the lease: the next campaigner is elected at
    /// once). Best effort: an unreachable etcd lets the lease expire instead.
    pub async fn resign(self) {
        self.renew.abort();
        let mut lc = self.client.lease_client();
        let _ = tokio::time::timeout(Duration::from_secs(2), lc.revoke(self.lease)).await;
    }
}

impl Election {
    pub fn new(client: etcd_client::Client, cfg: &EtcdConfig, group: &'static str) -> Election {
        Election {
            client,
            name: format!("{}election/{group}", cfg.prefix),
            member: cfg.member_name(),
            ttl: Duration::from_secs(cfg.lease_ttl_secs),
            group,
        }
    }

    /// Campaign until elected (or `stop`): a fresh lease per attempt, renewed while
    /// waiting; an etcd failure is retried after a pause.
    pub async fn campaign(&self, stop: &CancellationToken) -> Option<Leadership> {
        let mut pause = Duration::from_millis(200);
        loop {
            let attempt = tokio::select! {
                _ = stop.cancelled() => return None,
                r = self.attempt(stop) => r,
            };
            match attempt {
                Ok(Some(l)) => return Some(l),
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!(group = self.group, error = %e, "leader election failed; retrying");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(self.ttl);
        }
    }

    async fn attempt(&self, stop: &CancellationToken) -> Result<Option<Leadership>, etcd_client::Error> {
        let mut lc = self.client.lease_client();
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(10);
        let lease = lc.grant(ttl, None).await?.id();
        let lost = CancellationToken::new();
        let renew = tokio::spawn(renew(self.client.clone(), lease, self.ttl, lost.clone()));
        let mut ec = self.client.election_client();
        // The client's request timeout ends a campaign that waits behind a leader;
        // campaigning again with the same lease resumes the same candidacy.
        let elected = loop {
            if lost.is_cancelled() || stop.is_cancelled() {
                renew.abort();
                let _ = tokio::time::timeout(Duration::from_secs(1), lc.revoke(lease)).await;
                if stop.is_cancelled() {
                    return Ok(None);
                }
                return Err(etcd_client::Error::ElectError("lease lost while campaigning".into()));
            }
            match ec.campaign(self.name.clone(), self.member.clone(), lease).await {
                Ok(r) => break r,
                Err(etcd_client::Error::GRpcStatus(s))
                    if matches!(s.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) =>
                {
                    continue
                }
                Err(e) => {
                    renew.abort();
                    let _ = tokio::time::timeout(Duration::from_secs(1), lc.revoke(lease)).await;
                    return Err(e);
                }
            }
        };
        let Some(key) = elected.leader() else {
            renew.abort();
            return Err(etcd_client::Error::ElectError("campaign answered without a leader key".into()));
        };
        Ok(Some(Leadership {
            fence: Fence {
                key: key.key().to_vec(),
                create_rev: key.rev(),
            },
            lease,
            lost,
            renew,
            client: self.client.clone(),
        }))
    }
}

/// Renew `lease` every third of `ttl`; cancel `lost` when two thirds of it passed
/// without a renewal, or etcd says the lease is gone.
async fn renew(client: etcd_client::Client, lease: i64, ttl: Duration, lost: CancellationToken) {
    let every = ttl / 3;
    let deadline = ttl * 2 / 3;
    let mut last_ok = Instant::now();
    let mut lc = client.lease_client();
    let mut keeper: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
    loop {
        if last_ok.elapsed() >= deadline {
            lost.cancel();
            return;
        }
        let left = deadline.saturating_sub(last_ok.elapsed());
        let step = async {
            if keeper.is_none() {
                keeper = Some(lc.keep_alive(lease).await?);
                return Ok(Some(ttl.as_secs() as i64));
            }
            let (k, s) = keeper.as_mut().expect("set above");
            k.keep_alive().await?;
            Ok::<_, etcd_client::Error>(s.message().await?.map(|r| r.ttl()))
        };
        match tokio::time::timeout(left, step).await {
            Ok(Ok(Some(t))) if t > 0 => last_ok = Instant::now(),
            Ok(Ok(Some(_))) => {
                tracing::warn!(lease, "election lease expired at etcd");
                lost.cancel();
                return;
            }
            Ok(Ok(None)) | Ok(Err(_)) => keeper = None,
            Err(_) => {}
        }
        tokio::time::sleep(every.min(deadline.saturating_sub(last_ok.elapsed()))).await;
    }
}
