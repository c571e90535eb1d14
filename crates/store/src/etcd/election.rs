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
use crate::settings::EtcdConfig;

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
        self.leader
            .get_or_create(&GroupLabel {
                group: group.into(),
            })
            .set(0);
    }

    pub fn set(&self, group: &str, leading: bool) {
        self.leader
            .get_or_create(&GroupLabel {
                group: group.into(),
            })
            .set(leading as i64);
    }
}

/// The election of one controller group.
pub struct Election {
    client: etcd_client::Client,
    /// `{prefix}election/{group}/`: each candidate's key is this + its lease id (hex).
    prefix: String,
    member: String,
    ttl: Duration,
    request_timeout: Duration,
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
    /// Resolves when the lease could not be renewed in time, or a write was fenced
    /// (see the module doc).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Give the leadership up (revoke the lease: the next campaigner is elected at
    /// once). Best effort: an unreachable etcd lets the lease expire instead.
    pub async fn resign(self) {
        self.renew.abort();
        self.lost.cancel();
        let mut lc = self.client.lease_client();
        let _ = tokio::time::timeout(Duration::from_secs(2), lc.revoke(self.lease)).await;
    }
}

type Failed = etcd_client::Error;

fn failed(what: &str) -> Failed {
    etcd_client::Error::ElectError(what.into())
}

impl Election {
    pub fn new(client: etcd_client::Client, cfg: &EtcdConfig, group: &'static str) -> Election {
        Election {
            client,
            prefix: format!("{}election/{group}/", cfg.prefix),
            member: cfg.member_name(),
            ttl: Duration::from_secs(cfg.lease_ttl_secs),
            request_timeout: Duration::from_millis(cfg.request_timeout_ms),
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
                r = self.attempt() => r,
            };
            match attempt {
                Ok(l) => return Some(l),
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

    /// etcd's election recipe, run here rather than through its `Campaign` RPC (whose
    /// server side deletes the candidate's key when the call is cut, e.g. by a request
    /// timeout, which left candidates elected on a key that no longer existed): put
    /// this candidate's key on a fresh lease; wait until no key created before it
    /// remains (watching the one just before it); then check the key is still ours.
    async fn attempt(&self) -> Result<Leadership, Failed> {
        let mut lc = self.client.lease_client();
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(10);
        let lease = self.bounded(lc.grant(ttl, None)).await?.id();
        let lost = CancellationToken::new();
        let renew = tokio::spawn(renew(self.client.clone(), lease, self.ttl, lost.clone()));
        let out = tokio::select! {
            r = self.queue(lease) => r,
            _ = lost.cancelled() => Err(failed("lease lost while campaigning")),
        };
        match out {
            Ok(create_rev) => Ok(Leadership {
                fence: Fence::new(self.key(lease).into_bytes(), create_rev, lost.clone()),
                lease,
                lost,
                renew,
                client: self.client.clone(),
            }),
            Err(e) => {
                renew.abort();
                let _ = tokio::time::timeout(Duration::from_secs(1), lc.revoke(lease)).await;
                Err(e)
            }
        }
    }

    fn key(&self, lease: i64) -> String {
        format!("{}{lease:x}", self.prefix)
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Failed>>,
    ) -> Result<T, Failed> {
        tokio::time::timeout(self.request_timeout, f)
            .await
            .map_err(|_| failed("request timed out"))?
    }

    /// Enter the queue with `lease`'s key and wait for its turn; the key's create
    /// revision once it leads.
    async fn queue(&self, lease: i64) -> Result<i64, Failed> {
        use etcd_client::{
            Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
            WatchOptions,
        };
        let key = self.key(lease);
        let mut kv = self.client.kv_client();
        let put = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                self.member.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let r = self.bounded(kv.txn(put)).await?;
        if !r.succeeded() {
            return Err(failed("a fresh lease's key already exists"));
        }
        let mine = r
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| failed("no revision"))?;
        loop {
            // The candidate just before this one, if any.
            let before = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(mine - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1);
            let r = self
                .bounded(kv.get(self.prefix.clone(), Some(before)))
                .await?;
            let Some(prev) = r.kvs().first() else {
                break;
            };
            let (prev_key, at) = (
                prev.key().to_vec(),
                r.header().map(|h| h.revision()).unwrap_or(0),
            );
            // Wait for it to go (deleted: resigned, or its lease expired).
            let mut wc = self.client.watch_client();
            let opts = WatchOptions::new().with_start_revision(at + 1);
            let mut stream = self.bounded(wc.watch(prev_key, Some(opts))).await?;
            loop {
                let Some(m) = stream.message().await? else {
                    break;
                };
                if m.canceled()
                    || m.events()
                        .iter()
                        .any(|e| e.event_type() == etcd_client::EventType::Delete)
                {
                    break;
                }
            }
        }
        // Elected only if the key is still this lease's (it went if the lease did).
        let r = self.bounded(kv.get(key, None)).await?;
        match r.kvs().first() {
            Some(k) if k.create_revision() == mine && k.lease() == lease => Ok(mine),
            _ => Err(failed("the candidate key went while waiting")),
        }
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
