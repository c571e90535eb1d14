//! The engine a store runs on (`[store] backend`): the embedded redb engine or etcd, as
//! one enum ([`Backend`]) that dispatches each [`KvBackend`] call with one branch and
//! counts every transaction in the store's metrics. Above both engines and the seam
//! ([`super::backend`]) they implement.

use super::backend::{KeyValue, KvBackend, KvError, Op, Rev, TxnResult};
#[cfg(feature = "etcd")]
use super::etcd::EtcdKv;
use super::kv::{Kv, Watch};
use super::seal::Sealing;

/// The engine a store runs on (`[store] backend`). Both serve reads and watches
/// from the same in-memory state type, so they share the watch type.
#[derive(Clone)]
pub enum Backend {
    Embedded(Kv),
    #[cfg(feature = "etcd")]
    Etcd(EtcdKv),
}

#[cfg(feature = "etcd")]
impl Backend {
    /// A clone whose every write also requires `fence` (etcd only: an embedded
    /// store has one appliance and no elections, so it is returned as is).
    pub(crate) fn fenced(&self, fence: super::etcd::Fence) -> Backend {
        match self {
            Backend::Embedded(k) => Backend::Embedded(k.clone()),
            Backend::Etcd(e) => Backend::Etcd(e.fenced(fence)),
        }
    }
}

impl KvBackend for Backend {
    type Watch = Watch;

    #[inline]
    fn revision(&self) -> Rev {
        match self {
            Backend::Embedded(k) => k.revision(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => KvBackend::revision(e),
        }
    }

    #[inline]
    fn get(&self, key: &str) -> Option<KeyValue> {
        match self {
            Backend::Embedded(k) => k.get(key),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => KvBackend::get(e, key),
        }
    }

    #[inline]
    fn range(&self, prefix: &str) -> (Vec<KeyValue>, Rev) {
        match self {
            Backend::Embedded(k) => k.list(prefix),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => KvBackend::range(e, prefix),
        }
    }

    #[inline]
    fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, f: F) -> Rev {
        match self {
            Backend::Embedded(k) => k.scan(prefix, f),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => KvBackend::scan(e, prefix, f),
        }
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResult, KvError> {
        let started = std::time::Instant::now();
        let r = match self {
            Backend::Embedded(k) => k.txn(ops).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.txn(ops).await,
        };
        super::metrics::global().observe(r.as_ref(), started.elapsed());
        r
    }

    #[inline]
    fn watch(&self, prefix: &str, from: Rev) -> Result<Watch, KvError> {
        match self {
            Backend::Embedded(k) => k.watch(prefix, from),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.watch(prefix, from),
        }
    }

    fn close(&self) {
        match self {
            Backend::Embedded(k) => k.close(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.close(),
        }
    }

    fn sealing(&self) -> &Sealing {
        match self {
            Backend::Embedded(k) => k.sealing(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.sealing(),
        }
    }
}
