//! The seam between the object store and the engine that keeps its keys: the
//! etcd-shaped operations [`super::Store`] is written against ([`KvBackend`]), and
//! the values they take and give.
//!
//! Two engines implement it: redb ([`super::kv::Kv`], one appliance) and etcd
//! ([`super::etcd::EtcdKv`], several); [`super::engine::Backend`] is the one the store
//! runs on, chosen by `[store] backend`. Both engines build on this file, and it on
//! neither. What a backend must provide, as etcd does:
//! - one global revision, bumped once per committed transaction; each key records
//!   the revision that created it and the one that last modified it (`mod_rev`);
//! - `get` of a key and `range` of a prefix (in key order, with the revision read at);
//! - `txn`: all-or-nothing operations, each guarded by a [`Compare`] (absent, exists,
//!   `mod_rev` equals), so create-if-absent, update-if-rev and delete-if-rev;
//! - `watch` of a prefix from a revision: every later change exactly once, in order;
//!   [`KvError::Compacted`] when that revision is no longer kept and
//!   [`KvError::Lagged`] when a live watch fell behind (both become 410 Gone above);
//! - a stored object's text carries its `mod_rev` as `metadata.resourceVersion`
//!   (kube's etcd3 versioner; the redb engine writes it at commit, the etcd backend
//!   stamps it on read).
//!
//! Cost: [`super::Store`] is generic over the backend (default
//! [`super::engine::Backend`], an enum of the two: one predictable branch per call, no
//! boxing, no extra copy).

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::seal::Sealing;

/// A global revision (etcd's `revision`).
pub type Rev = u64;

/// The largest value (its compact JSON text) a put may store: etcd's default request
/// limit, which Kubernetes objects live within. Checked on the caller's thread when
/// the text is made, before the transaction is queued, so nothing is stored.
pub(crate) const MAX_VALUE_BYTES: usize = 1536 << 10;

/// A key-value engine with etcd's semantics (see the module doc). Cheap to clone.
pub trait KvBackend: Clone + Send + Sync + 'static {
    type Watch: KvWatch;

    /// The current (latest committed) revision.
    fn revision(&self) -> Rev;

    fn get(&self, key: &str) -> Option<KeyValue>;

    /// Every key with `prefix`, in key order, and the revision the range was read at.
    fn range(&self, prefix: &str) -> (Vec<KeyValue>, Rev);

    /// Visit every key with `prefix` in key order without collecting them; returns the
    /// revision read at.
    fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, f: F) -> Rev;

    /// Commit `ops` atomically; resolves once the commit is durable.
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<TxnResult, KvError>> + Send;

    /// Changes to keys with `prefix` after revision `from` (`FutureRevision` for a
    /// `from` not written yet, `Compacted` for one no longer kept).
    fn watch(&self, prefix: &str, from: Rev) -> Result<Self::Watch, KvError>;

    /// Finish what is queued, then refuse further writes (`Closed`) and end watches.
    /// Blocking.
    fn close(&self);

    /// The keys Secrets are sealed with at rest and the ledger of which key each is
    /// stored under ([`super::seal`]).
    fn sealing(&self) -> &Sealing;
}

/// A watch from a [`KvBackend`].
pub trait KvWatch: Send + 'static {
    /// The next change, in revision order: `Lagged` when it fell too far behind,
    /// `Closed` when the backend closed. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Event, KvError>> + Send;
}

/// One stored value with its revisions.
#[derive(Debug, Clone)]
pub struct KeyValue {
    pub key: Arc<str>,
    /// The value as compact JSON text (what the backend stores).
    pub raw: Arc<str>,
    pub create_rev: Rev,
    pub mod_rev: Rev,
    /// The parsed value, when the backend still holds the one that was written (the
    /// redb engine keeps it for its latest writes, see [`super::kv`]).
    pub(super) hot: Option<Arc<Value>>,
}

impl KeyValue {
    /// The value (field order kept): shared while hot, else parsed from
    /// [`KeyValue::raw`].
    pub(crate) fn value(&self) -> Arc<Value> {
        match &self.hot {
            Some(v) => v.clone(),
            None => Arc::new(parse(&self.key, &self.raw)),
        }
    }
}

/// Parse stored text. The text was written by `serde_json` itself (or checked by the
/// backend when it loaded it), so it always parses; `Null` would only stand for a bug.
fn parse(key: &str, raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|e| {
        tracing::error!(key, error = %e, "stored value does not parse");
        Value::Null
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A committed change. For deletes, `kv` holds the last value with `mod_rev` set to
/// the deleting revision.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// Whether the key existed before this change (false for creates). The previous
    /// value itself is not kept: every event in the replay log would pin a second,
    /// superseded copy of its object, and no watcher reads it.
    pub existed: bool,
}

impl Event {
    pub(crate) fn rev(&self) -> Rev {
        self.kv.mod_rev
    }
}

/// The guard of one operation in a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// No condition.
    Any,
    /// The key must not exist.
    Absent,
    /// The key must exist.
    Exists,
    /// The key must exist with this `mod_rev`.
    ModRev(Rev),
}

#[derive(Debug, Clone)]
pub enum Action {
    Put(Arc<Value>),
    Delete,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub key: String,
    pub compare: Compare,
    pub action: Action,
}

impl Op {
    pub(crate) fn put(key: impl Into<String>, compare: Compare, value: Value) -> Op {
        Op {
            key: key.into(),
            compare,
            action: Action::Put(Arc::new(value)),
        }
    }
    pub(crate) fn delete(key: impl Into<String>, compare: Compare) -> Op {
        Op {
            key: key.into(),
            compare,
            action: Action::Delete,
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KvError {
    #[error("{key} already exists")]
    AlreadyExists { key: String },
    #[error("{key} not found")]
    NotFound { key: String },
    #[error("{key} was modified (expected revision {expected}, found {actual})")]
    Conflict {
        key: String,
        expected: Rev,
        actual: Rev,
    },
    #[error("revision {requested} has been compacted (oldest available is {oldest})")]
    Compacted { requested: Rev, oldest: Rev },
    #[error("revision {requested} is in the future (current is {current})")]
    FutureRevision { requested: Rev, current: Rev },
    #[error("{key}: value of {size} bytes is over the limit of {limit} bytes")]
    TooLarge {
        key: String,
        size: usize,
        limit: usize,
    },
    #[error("watch fell too far behind and was closed")]
    Lagged,
    #[error("store is closed")]
    Closed,
    /// The backend cannot commit now (etcd unreachable, or refusing the request
    /// before it was sent to a member): nothing was written.
    #[error("{0}")]
    Unavailable(String),
    /// The request reached etcd (or may have) and no answer came: it timed out (no
    /// quorum: etcd's leader holds it and may commit it once a quorum is back), or its
    /// connection broke and a second send found the objects changed. Whether it was
    /// applied is unknown; reading again tells.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// The write was fenced: this appliance no longer holds the leadership it wrote
    /// under (see [`super::etcd`]).
    #[error("this appliance is no longer the leader of its controller group")]
    Fenced,
    #[error("storage error: {0}")]
    Storage(String),
    /// A sealed value no key of the key file opens (names the object and the key name).
    #[error("{0}")]
    Sealed(#[from] super::seal::SealError),
}

/// Result of a committed transaction: its revision and the new value of each op
/// (`None` for deletes), stored and as the parsed value that was written (with its
/// `metadata.resourceVersion` stamped), so writers need not parse it back.
#[derive(Debug, Clone)]
pub struct TxnResult {
    pub rev: Rev,
    pub kvs: Vec<Option<KeyValue>>,
    pub values: Vec<Option<Arc<Value>>>,
}
