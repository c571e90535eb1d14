//! The DHCP loop's durable-commit seam: where a group commit's lease changes go before
//! the ACKs waiting for them leave. [`Ledger::Log`] is one appliance's fsync'd lease log
//! ([`super::persist`]; the embedded store); [`Ledger::Cluster`] is etcd, shared by
//! several appliances ([`super::cluster`]; `[store] backend = "etcd"`). The loop is the
//! same for both: it queues changes, runs one commit at a time off the loop, and when
//! it ends asks the ledger what becomes of each ACK ([`Verdict`]).

#[cfg(feature = "etcd")]
use std::collections::HashMap;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use tokio::task::JoinHandle;

#[cfg(feature = "etcd")]
use super::cluster::{self, MirrorMsg, Outcome};
use super::core::Reply;
use super::leases::{Change, Lease, LeaseIndex, LeaseTable};
use super::metrics::Metrics;
use super::persist::LeaseLog;
use crate::model::ident::Mac;

/// Without the etcd feature there is no cluster mirror: its message never comes.
#[cfg(not(feature = "etcd"))]
pub(crate) enum MirrorMsg {}

use super::leases::Verdict;

/// Where lease changes are made durable.
pub(crate) enum Ledger {
    /// The lease log (absent while a write runs) at `path`.
    Log {
        log: Option<LeaseLog>,
        path: PathBuf,
    },
    #[cfg(feature = "etcd")]
    Cluster(Box<cluster::Ledger>),
}

/// A commit that ended.
pub(crate) enum Done {
    Log {
        log: LeaseLog,
        journal: Vec<Change>,
        result: std::io::Result<()>,
    },
    #[cfg(feature = "etcd")]
    Cluster(Vec<(Ipv4Addr, Outcome)>),
}

/// How a commit ended, for the verdicts of its ACKs.
pub(crate) enum Settled {
    /// Every change is on disk (or none is).
    Log(bool),
    #[cfg(feature = "etcd")]
    Cluster(HashMap<Ipv4Addr, Outcome>),
}

fn write_log(mut log: LeaseLog, journal: Vec<Change>) -> Done {
    let result = log.append(&journal);
    Done::Log {
        log,
        journal,
        result,
    }
}

impl Ledger {
    /// Whether a commit can start (the log is back from the last one).
    pub(crate) fn can_begin(&self) -> bool {
        match self {
            Ledger::Log { log, .. } => log.is_some(),
            #[cfg(feature = "etcd")]
            Ledger::Cluster(_) => true,
        }
    }

    /// Whether new leases can be granted now (the log: always).
    pub(crate) fn available(&self) -> bool {
        match self {
            Ledger::Log { .. } => true,
            #[cfg(feature = "etcd")]
            Ledger::Cluster(c) => c.available(),
        }
    }

    /// `changes` wait for the next commit.
    pub(crate) fn queued(&mut self, changes: &[Change]) {
        #[cfg(feature = "etcd")]
        if let Ledger::Cluster(c) = self {
            c.queued(changes);
        }
        #[cfg(not(feature = "etcd"))]
        let _ = changes;
    }

    /// Start the commit of `journal` (the log: on the blocking pool; etcd: a task).
    pub(crate) fn begin(&mut self, journal: Vec<Change>) -> JoinHandle<Done> {
        match self {
            Ledger::Log { log, .. } => {
                let l = log.take().expect("guarded by can_begin");
                tokio::task::spawn_blocking(move || write_log(l, journal))
            }
            #[cfg(feature = "etcd")]
            Ledger::Cluster(c) => {
                let (writer, intents) = c.begin(journal);
                tokio::spawn(async move { Done::Cluster(writer.write(intents).await) })
            }
        }
    }

    /// The next message of the cluster's mirror (never, for the log).
    pub(crate) async fn next_mirror(&mut self) -> MirrorMsg {
        match self {
            Ledger::Log { .. } => std::future::pending().await,
            #[cfg(feature = "etcd")]
            Ledger::Cluster(c) => c.next_mirror().await,
        }
    }

    pub(crate) fn observe(&mut self, msg: MirrorMsg, table: &mut LeaseTable, index: &LeaseIndex) {
        #[cfg(feature = "etcd")]
        if let Ledger::Cluster(c) = self {
            c.observe(msg, table, index);
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = (table, index);
            match msg {}
        }
    }

    /// A commit ended: publish its leases to `index` (and `table`, from etcd), count it;
    /// the log is compacted when due.
    pub(crate) fn finish(
        &mut self,
        done: Done,
        table: &mut LeaseTable,
        index: &LeaseIndex,
        metrics: &Metrics,
    ) -> Settled {
        match (self, done) {
            (
                Ledger::Log { log, path },
                Done::Log {
                    log: mut l,
                    journal,
                    result,
                },
            ) => {
                let ok = match result {
                    Ok(()) => {
                        metrics.commits.inc();
                        index.apply(&journal);
                        true
                    }
                    Err(e) => {
                        tracing::error!(error = %e, path = %path.display(), "writing leases failed; not acknowledging");
                        false
                    }
                };
                if l.wants_compaction(|| table.persisted().count()) {
                    let snapshot: Vec<Lease> = table.persisted().cloned().collect();
                    if let Err(e) = l.compact(&snapshot) {
                        tracing::warn!(error = %e, "compacting lease log failed");
                    }
                }
                *log = Some(l);
                Settled::Log(ok)
            }
            #[cfg(feature = "etcd")]
            (Ledger::Cluster(c), Done::Cluster(outcomes)) => {
                metrics.commits.inc();
                Settled::Cluster(c.finish(outcomes, table, index, metrics))
            }
            #[allow(unreachable_patterns)] // without etcd: one ledger, one kind of commit
            _ => unreachable!("a commit ends in the ledger that began it"),
        }
    }

    /// The verdicts of `acks` (their commit ended as `settled`) at `now`, and whether a
    /// grant of `(address, MAC)` among them became durable.
    pub(crate) fn verdicts(
        &self,
        settled: &Settled,
        acks: &[(Reply, u16)],
        now: u64,
    ) -> (Vec<Verdict>, Granted) {
        #[cfg(not(feature = "etcd"))]
        let _ = now;
        match (self, settled) {
            (_, Settled::Log(ok)) => {
                let v = if *ok { Verdict::Send } else { Verdict::Drop };
                (vec![v; acks.len()], Granted::All(*ok))
            }
            #[cfg(feature = "etcd")]
            (Ledger::Cluster(c), Settled::Cluster(o)) => {
                let verdicts: Vec<Verdict> =
                    acks.iter().map(|(r, _)| c.verdict(o, r, now)).collect();
                let granted = acks
                    .iter()
                    .zip(&verdicts)
                    .filter(|(_, v)| matches!(v, Verdict::Send | Verdict::Renewal(_)))
                    .filter_map(|((r, _), _)| Some((r.msg.yiaddr(), cluster::reply_mac(r)?)))
                    .collect();
                (verdicts, Granted::These(granted))
            }
            #[cfg(feature = "etcd")]
            (Ledger::Log { .. }, Settled::Cluster(_)) => unreachable!("settled by its own ledger"),
        }
    }
}

/// Which grants of a commit became durable.
pub enum Granted {
    /// All of them or none (the lease log).
    All(bool),
    These(HashSet<(Ipv4Addr, Mac)>),
}

impl Granted {
    pub(crate) fn contains(&self, ip: Ipv4Addr, mac: Mac) -> bool {
        match self {
            Granted::All(ok) => *ok,
            Granted::These(s) => s.contains(&(ip, mac)),
        }
    }
}
