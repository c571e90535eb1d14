//! DHCP membership in etcd: this appliance's keys and the view of everyone's.
//!
//! Keys under `{prefix}dhcp-members/{scope}/`: `live/{name}` on a lease of
//! `member_ttl` (put at start, renewed every third of the TTL, revoked at shutdown;
//! when a renewal finds the lease gone the keys are put again on a new one) and
//! `peer/{name}`, permanent; both hold `{"server_ip": "..."}`. [`start`] registers,
//! lists the prefix once (waited for, so an appliance never answers on a view it has
//! not read) and follows it with a watch from the listing's revision, listing again
//! when the watch breaks; each change is published as a [`View`] on a watch channel,
//! which the DHCP loop applies between batches. While etcd cannot be reached the last
//! view stays (nothing is granted then anyway).
//!
//! Bounds: one lease and two keys per appliance; the view holds one entry per member
//! (at most `MAX_MEMBERS`, the rest ignored with a warning); every request is bounded
//! by `store.etcd.request_timeout_ms`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use etcd_client::{Client, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::View;
use crate::shutdown::Shutdown;
use crate::store::settings::EtcdConfig;

/// Members a view keeps.
const MAX_MEMBERS: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    server_ip: Ipv4Addr,
}

/// The scope's member keys.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(etcd_prefix: &str, scope: &str) -> Keys {
        Keys {
            prefix: format!("{etcd_prefix}dhcp-members/{scope}/"),
        }
    }

    pub fn live(&self, name: &str) -> String {
        format!("{}live/{name}", self.prefix)
    }

    pub fn peer(&self, name: &str) -> String {
        format!("{}peer/{name}", self.prefix)
    }
}

/// What one appliance says of itself.
#[derive(Debug, Clone)]
pub struct Me {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ttl: Duration,
}

/// Live members and every member's address, by name, as read from the keys.
#[derive(Debug, Default)]
struct Roster {
    live: BTreeMap<String, Ipv4Addr>,
    peers: BTreeMap<String, Ipv4Addr>,
}

impl Roster {
    /// A put (`Some` value) or delete of `key`.
    fn apply(&mut self, keys: &Keys, key: &[u8], value: Option<&[u8]>) {
        let Some(rest) = key.strip_prefix(keys.prefix.as_bytes()) else {
            return;
        };
        let Ok(rest) = std::str::from_utf8(rest) else {
            return;
        };
        let (map, name) = if let Some(n) = rest.strip_prefix("live/") {
            (&mut self.live, n)
        } else if let Some(n) = rest.strip_prefix("peer/") {
            (&mut self.peers, n)
        } else {
            return;
        };
        match value.map(serde_json::from_slice::<Record>) {
            None => {
                map.remove(name);
            }
            Some(Ok(r)) if map.len() < MAX_MEMBERS || map.contains_key(name) => {
                map.insert(name.to_string(), r.server_ip);
            }
            Some(Ok(_)) => {
                tracing::warn!(
                    member = name,
                    "more than {MAX_MEMBERS} dhcp members; ignored"
                )
            }
            Some(Err(e)) => {
                tracing::warn!(member = name, error = %e, "dhcp member record does not parse; ignored")
            }
        }
    }

    fn view(&self, me: &Me) -> View {
        View::new(
            &me.name,
            me.ip,
            self.live.keys().map(String::as_str),
            self.peers
                .iter()
                .chain(self.live.iter())
                .map(|(n, ip)| (n.as_str(), *ip)),
        )
    }
}

/// Register this appliance, read the members once, and keep both current until
/// shutdown (`None`: shutdown came first). The receiver has the view, updated on
/// every change.
pub async fn start(
    cfg: &EtcdConfig,
    scope: &str,
    me: Me,
    shutdown: &mut Shutdown,
) -> Result<Option<watch::Receiver<View>>> {
    let client = crate::store::etcd::client::connect(cfg).await?;
    let keys = Keys::new(&cfg.prefix, scope);
    let timeout = Duration::from_millis(cfg.request_timeout_ms);
    tokio::spawn(register(
        client.clone(),
        keys.clone(),
        me.clone(),
        timeout,
        shutdown.child(),
    ));
    let (tx, rx) = watch::channel(View::solo(&me.name, me.ip));
    let mut roster = Roster::default();
    let mut pause = Duration::from_millis(100);
    let rev = loop {
        let listed = tokio::select! {
            _ = shutdown.recv() => return Ok(None),
            r = list(&client, &keys, timeout, &mut roster) => r,
        };
        match listed {
            Ok(rev) => break rev,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "dhcp waits for etcd to list its members");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    };
    tx.send_replace(roster.view(&me));
    tokio::spawn(follow(
        (client, keys, timeout),
        me,
        (roster, rev),
        tx,
        shutdown.child(),
    ));
    Ok(Some(rx))
}

/// List every member key into `roster` (replacing it); the listing's revision.
async fn list(client: &Client, keys: &Keys, timeout: Duration, roster: &mut Roster) -> Result<i64> {
    let mut kv = client.kv_client();
    let opts = GetOptions::new()
        .with_prefix()
        .with_limit(2 * MAX_MEMBERS as i64);
    let resp = tokio::time::timeout(timeout, kv.get(keys.prefix.clone(), Some(opts)))
        .await
        .context("listing dhcp members in etcd: timed out")??;
    *roster = Roster::default();
    for kv in resp.kvs() {
        roster.apply(keys, kv.key(), Some(kv.value()));
    }
    Ok(resp.header().map_or(0, |h| h.revision()))
}

/// Watch from `rev + 1`, publishing a view per change; list again after an error.
async fn follow(
    (client, keys, timeout): (Client, Keys, Duration),
    me: Me,
    (mut roster, mut rev): (Roster, i64),
    tx: watch::Sender<View>,
    mut shutdown: Shutdown,
) {
    loop {
        let r = tokio::select! {
            _ = shutdown.recv() => return,
            r = watch_from(&client, (&keys, timeout), rev, &mut roster, (&me, &tx)) => r,
        };
        if tx.is_closed() {
            return;
        }
        tracing::debug!(error = %format!("{:#}", r.err().unwrap_or_else(|| anyhow::anyhow!("ended"))), "dhcp member watch broke; listing again");
        loop {
            let listed = tokio::select! {
                _ = shutdown.recv() => return,
                r = async {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    list(&client, &keys, timeout, &mut roster).await
                } => r,
            };
            if let Ok(r) = listed {
                rev = r;
                tx.send_replace(roster.view(&me));
                break;
            }
        }
    }
}

/// One watch of the member keys from `rev + 1`, until it breaks.
async fn watch_from(
    client: &Client,
    (keys, timeout): (&Keys, Duration),
    rev: i64,
    roster: &mut Roster,
    (me, tx): (&Me, &watch::Sender<View>),
) -> Result<()> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(rev + 1);
    let mut w = client.watch_client();
    let mut stream = tokio::time::timeout(timeout, w.watch(keys.prefix.clone(), Some(opts)))
        .await
        .context("watching dhcp members in etcd: timed out")??;
    loop {
        let Some(resp) = stream.message().await? else {
            bail!("the etcd watch ended");
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            bail!("the member watch was canceled or compacted");
        }
        for e in resp.events() {
            if let Some(kv) = e.kv() {
                let value = (e.event_type() == EventType::Put).then(|| kv.value());
                roster.apply(keys, kv.key(), value);
            }
        }
        let view = roster.view(me);
        if *tx.borrow() != view {
            tracing::info!(live = ?view.live().collect::<Vec<_>>(), "dhcp members changed");
            tx.send_replace(view);
        }
        if tx.is_closed() {
            return Ok(());
        }
    }
}

/// Keep `live/{name}` on a lease and `peer/{name}` put until shutdown, then revoke.
async fn register(client: Client, keys: Keys, me: Me, timeout: Duration, mut shutdown: Shutdown) {
    let value = serde_json::to_string(&Record { server_ip: me.ip }).expect("serializes");
    let mut pause = Duration::from_millis(100);
    loop {
        let lease = tokio::select! {
            _ = shutdown.recv() => return,
            r = put_on_lease(&client, &keys, &me, &value, timeout) => r,
        };
        let lease = match lease {
            Ok(l) => {
                pause = Duration::from_millis(100);
                l
            }
            Err(e) => {
                tracing::debug!(error = %format!("{e:#}"), "dhcp member registration failed; retrying");
                tokio::select! {
                    _ = shutdown.recv() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(me.ttl / 3);
                continue;
            }
        };
        let stopped = tokio::select! {
            _ = shutdown.recv() => true,
            _ = keep(&client, lease, me.ttl) => false,
        };
        if stopped {
            // Leave at once, so the others answer this appliance's clients now.
            let mut lc = client.lease_client();
            let _ = tokio::time::timeout(Duration::from_secs(1), lc.revoke(lease)).await;
            return;
        }
        tracing::warn!(lease, "dhcp member lease lapsed; registering again");
    }
}

/// A new lease of `me.ttl` with both keys put on it (one Txn); the lease's id.
async fn put_on_lease(
    client: &Client,
    keys: &Keys,
    me: &Me,
    value: &str,
    timeout: Duration,
) -> Result<i64> {
    let mut lc = client.lease_client();
    let ttl = me.ttl.as_secs().max(2) as i64;
    let lease = tokio::time::timeout(timeout, lc.grant(ttl, None))
        .await
        .context("granting a lease: timed out")??
        .id();
    let txn = Txn::new().and_then([
        TxnOp::put(
            keys.live(&me.name),
            value,
            Some(PutOptions::new().with_lease(lease)),
        ),
        TxnOp::put(keys.peer(&me.name), value, None),
    ]);
    let mut kv = client.kv_client();
    tokio::time::timeout(timeout, kv.txn(txn))
        .await
        .context("putting the member keys: timed out")??;
    Ok(lease)
}

/// Renew `lease` every third of `ttl`; returns once it is gone (etcd says so, or no
/// renewal got through for a whole TTL).
async fn keep(client: &Client, lease: i64, ttl: Duration) {
    let mut lc = client.lease_client();
    let mut last_ok = tokio::time::Instant::now();
    let mut keeper = None;
    loop {
        tokio::time::sleep(ttl / 3).await;
        if last_ok.elapsed() >= ttl {
            return;
        }
        let step = async {
            if keeper.is_none() {
                keeper = Some(lc.keep_alive(lease).await?);
            }
            let (k, s): &mut (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream) =
                keeper.as_mut().expect("set above");
            k.keep_alive().await?;
            Ok::<_, etcd_client::Error>(s.message().await?.map(|r| r.ttl()))
        };
        match tokio::time::timeout(ttl / 3, step).await {
            Ok(Ok(Some(t))) if t > 0 => last_ok = tokio::time::Instant::now(),
            Ok(Ok(Some(_))) => return,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => keeper = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roster_reads_live_and_peer_keys_and_ignores_the_rest() {
        let keys = Keys::new("/p/", "boot");
        let mut r = Roster::default();
        let rec = |ip: &str| format!("{{\"server_ip\":\"{ip}\"}}").into_bytes();
        r.apply(&keys, keys.live("a").as_bytes(), Some(&rec("10.0.0.2")));
        r.apply(&keys, keys.peer("a").as_bytes(), Some(&rec("10.0.0.2")));
        r.apply(&keys, keys.peer("b").as_bytes(), Some(&rec("10.0.0.3")));
        r.apply(
            &keys,
            b"/p/dhcp-members/boot/other/x",
            Some(&rec("10.0.0.9")),
        );
        r.apply(&keys, b"/p/dhcp/boot/10.0.0.20", Some(b"{}"));
        r.apply(&keys, keys.peer("c").as_bytes(), Some(b"not json"));
        let me = Me {
            name: "a".into(),
            ip: "10.0.0.2".parse().unwrap(),
            ttl: Duration::from_secs(3),
        };
        let v = r.view(&me);
        assert_eq!(v.live().collect::<Vec<_>>(), ["a"]);
        let m = [2, 0, 0, 0, 0, 1];
        assert!(v.stands_in_for("10.0.0.3".parse().unwrap(), &m));
        assert!(!v.stands_in_for("10.0.0.9".parse().unwrap(), &m));
        // b comes back: no longer dead, and owns its share again
        r.apply(&keys, keys.live("b").as_bytes(), Some(&rec("10.0.0.3")));
        let v = r.view(&me);
        assert!(!v.stands_in_for("10.0.0.3".parse().unwrap(), &m));
        assert_eq!(v.live().count(), 2);
        r.apply(&keys, keys.live("b").as_bytes(), None);
        assert_eq!(r.view(&me).live().count(), 1);
    }
}
