//! A revisioned key-value store with etcd's semantics, embedded on redb: the
//! store's only [`KvBackend`] today (the seam and the types it shares live in
//! [`super::backend`], re-exported here). The writer thread is in `commit.rs`, the
//! text a put stores in `text.rs`.
//!
//! - One global revision, bumped once per committed transaction; every key records
//!   the revision that created it and the one that last modified it (`mod_rev`,
//!   which the object layer exposes as `metadata.resourceVersion`).
//! - Transactions are all-or-nothing lists of puts/deletes, each guarded by a
//!   comparison (absent, exists, mod_rev equals): compare-and-swap.
//! - Watches start from a revision and see every later change exactly once, in
//!   order: the last [`EVENT_LOG_CAP`] events are kept in memory for replay, and a
//!   watch from an older revision fails with [`KvError::Compacted`] (kube's 410 Gone),
//!   after which a client re-lists.
//!
//! Durability and throughput: a single writer thread takes every pending transaction
//! off a queue, validates them in order against the committed state, writes the whole
//! batch in one redb transaction (fsync'd, `Durability::Immediate`), and only then
//! publishes it to readers and watchers and acknowledges the callers (group commit).
//! So an acknowledged write survives `kill -9`, and no reader ever sees a write that
//! could still be lost. Every commit waits on that thread, so it does little besides:
//! callers serialize their values before queueing them (it splices in the revision),
//! and what a commit unlinks is freed on a reaper thread.
//!
//! Memory: every value is held as its compact JSON text ([`KeyValue::raw`], the same
//! bytes redb stores), not as a parsed `serde_json::Value`. With `preserve_order` a
//! parsed object costs ~10x its text (an `IndexMap` per JSON object, a heap string per
//! key and value): at 10,000 machines the parsed form was most of the appliance's
//! resident memory. Readers parse what they read ([`KeyValue::value`], a few µs for an
//! object); the text round-trips to an equal value with its field order kept. Live
//! watchers are woken with the new revision only and read the events from the replay
//! log, so the log is the only history kept in memory: an event shares its text with
//! the map entry while it is the current version.

mod commit;
pub(crate) mod text;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::thread;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

pub use super::backend::*;
#[cfg(feature = "etcd")]
pub(crate) use commit::compare;
use commit::writer_loop;
use text::{prepare, Prepared};

use super::seal::{is_sealed, Sealer, Sealing};

/// How many past events are kept, for watch replay and for live watchers (a watcher
/// further behind than this is closed and re-lists). Each event pins its object
/// version's JSON text (shared with the map while it is the current version), so this
/// bounds the store's history memory: ~1 KiB per event. (When events held parsed
/// values, 200,000 of them held ~700 MiB for a 10,000-machine fleet.)
pub(crate) const EVENT_LOG_CAP: usize = 20_000;
/// Commits whose unlinked versions may wait for the reaper thread.
const REAP_QUEUE: usize = 2;
/// Most transactions written in one redb commit.
const MAX_BATCH: usize = 2048;
/// redb's page cache. Every key is held in memory by the store itself and redb is
/// only read at open, so its cache only serves the B-tree pages a commit rewrites;
/// redb's default (1 GiB) let it keep every page it ever touched: at 10,000 machines
/// that was most of the appliance's resident memory.
const REDB_CACHE_BYTES: usize = 16 << 20;

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// How many of the latest writes keep their parsed value next to their text, in the
/// map and in the event log (the same `Arc`): a controller reads what was just
/// written (the watch event, then a `get` in the reconcile it queues), so those reads
/// share the writer's value instead of parsing. Bounded: ~5 KiB per object.
const HOT_WRITES: usize = 1024;

/// Every key in memory, the replay log and the revision: what readers and watchers
/// see. The redb writer publishes its commits into it; the etcd backend's mirror
/// publishes what its etcd watch delivers ([`super::etcd`]).
pub(crate) struct State {
    map: BTreeMap<Arc<str>, KeyValue>,
    rev: Rev,
    log: VecDeque<Event>,
    /// The last [`HOT_WRITES`] puts (key, revision), oldest first: the map entries
    /// that may hold a parsed value.
    hot: VecDeque<(Arc<str>, Rev)>,
    /// Watches may start at any revision >= this one.
    oldest_watchable: Rev,
}

impl State {
    pub(crate) fn new(map: BTreeMap<Arc<str>, KeyValue>, rev: Rev) -> State {
        State {
            map,
            rev,
            log: VecDeque::new(),
            hot: VecDeque::new(),
            oldest_watchable: rev,
        }
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn rev(&self) -> Rev {
        self.rev
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn get(&self, key: &str) -> Option<&KeyValue> {
        self.map.get(key)
    }

    /// Every key with `prefix`, in key order, and the revision read at.
    pub(crate) fn range(&self, prefix: &str) -> (Vec<KeyValue>, Rev) {
        let mut items = Vec::new();
        let rev = self.scan(prefix, |kv| items.push(kv.clone()));
        (items, rev)
    }

    /// Visit every key with `prefix` in key order; the revision read at.
    pub(crate) fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, mut f: F) -> Rev {
        for (_, v) in self
            .map
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            f(v)
        }
        self.rev
    }

    /// Replace everything with `map` at `rev` (a backend that had to list again):
    /// the log is emptied, so every watcher is told to re-list.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn reset(
        &mut self,
        map: BTreeMap<Arc<str>, KeyValue>,
        rev: Rev,
        garbage: &mut Garbage,
    ) {
        garbage
            .old
            .extend(std::mem::replace(&mut self.map, map).into_values());
        garbage.events.extend(self.log.drain(..));
        self.hot.clear();
        self.rev = rev;
        self.oldest_watchable = rev;
    }

    /// Make one committed revision visible: the keys it changed (`None`: deleted) and
    /// its events, in order. What the new versions replace goes into `garbage`, to be
    /// freed off the caller's lock.
    pub(crate) fn publish(
        &mut self,
        changes: impl IntoIterator<Item = (Arc<str>, Option<KeyValue>)>,
        evs: Vec<Event>,
        rev: Rev,
        garbage: &mut Garbage,
    ) {
        for (k, v) in changes {
            match v {
                Some(kv) => garbage.old.extend(self.map.insert(k, kv)),
                None => garbage.old.extend(self.map.remove(&k)),
            }
        }
        self.rev = rev;
        for e in evs {
            if self.log.len() >= EVENT_LOG_CAP {
                if let Some(old) = self.log.pop_front() {
                    self.oldest_watchable = old.rev();
                    garbage.events.push(old);
                }
            }
            if e.kind == EventKind::Put {
                self.hot.push_back((e.kv.key.clone(), e.rev()));
                if self.hot.len() > HOT_WRITES {
                    let (k, r) = self.hot.pop_front().expect("not empty");
                    if let Some(cur) = self.map.get_mut(&k).filter(|c| c.mod_rev == r) {
                        garbage.values.extend(cur.hot.take());
                    }
                }
            }
            self.log.push_back(e);
            if let Some(i) = self.log.len().checked_sub(HOT_WRITES + 1) {
                garbage.values.extend(self.log[i].kv.hot.take());
            }
        }
    }
}

/// Old versions and parsed values a commit unlinked, freed where no lock is held
/// (the redb engine hands them to its reaper thread).
#[derive(Default)]
pub(crate) struct Garbage {
    old: Vec<KeyValue>,
    events: Vec<Event>,
    values: Vec<Arc<Value>>,
}

struct Request {
    ops: Vec<Op>,
    /// Each put's text, serialized by the caller ([`Prepared`]), so the writer thread
    /// only splices in the revision.
    texts: Vec<Option<Prepared>>,
    reply: oneshot::Sender<Result<TxnResult, KvError>>,
}

enum Msg {
    Txn(Request),
    Close(oneshot::Sender<()>),
}

/// The embedded store. Cheap to clone (all clones share one database and writer).
#[derive(Clone)]
pub struct Kv {
    state: Arc<RwLock<State>>,
    tx: std::sync::mpsc::SyncSender<Msg>,
    /// The latest published revision; the writer thread holds the sender, so watchers
    /// see the channel close when the store does.
    published: watch::Receiver<Rev>,
    writer: Arc<std::sync::Mutex<Option<thread::JoinHandle<()>>>>,
    /// The keys Secrets are sealed with, and which key each is stored under.
    sealing: Sealing,
}

/// A record as redb stores it (into `out`, which is cleared first): the revisions,
/// then `sealed` (a sealed type's encrypted text, see [`super::seal`]) or the text.
fn encode(kv: &KeyValue, sealed: Option<&[u8]>, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&kv.mod_rev.to_le_bytes());
    out.extend_from_slice(&kv.create_rev.to_le_bytes());
    out.extend_from_slice(sealed.unwrap_or(kv.raw.as_bytes()));
}

/// A record read back, opened with `sealer` when sealed, and the key it was sealed
/// with (`None`: in clear).
fn decode(key: &str, b: &[u8], sealer: &Sealer) -> Result<(KeyValue, Option<Arc<str>>), KvError> {
    if b.len() < 16 {
        return Err(KvError::Storage(format!("record for {key} is truncated")));
    }
    let mod_rev = u64::from_le_bytes(b[0..8].try_into().unwrap());
    let create_rev = u64::from_le_bytes(b[8..16].try_into().unwrap());
    let opened = sealer.open(key, &b[16..], None)?;
    // Checked once here, so later parses of the text cannot fail; re-serialized so
    // the text is compact whatever wrote it.
    let mut value: Value = serde_json::from_slice(&opened.text)
        .map_err(|e| KvError::Storage(format!("record for {key} is corrupt: {e}")))?;
    if opened.key.is_some() {
        // Sealed before the revision was known (the text has an empty slot).
        text::stamp(&mut value, mod_rev);
    }
    let kv = KeyValue {
        key: Arc::from(key),
        raw: Arc::from(value.to_string()),
        create_rev,
        mod_rev,
        hot: None,
    };
    Ok((kv, opened.key))
}

fn storage<E: std::fmt::Display>(e: E) -> KvError {
    KvError::Storage(e.to_string())
}

impl Kv {
    /// Open (or create) the store at `path`, loading every key into memory; sealed
    /// values are opened with `sealer` (one that no key opens fails the open, naming
    /// the object and the key name).
    pub(crate) fn open(path: &Path, sealer: Sealer) -> Result<Kv, KvError> {
        let sealing = Sealing::new(sealer);
        // The store holds Secrets: create its file 0600 whatever the umask (redb
        // initialises an empty file; an existing file is left as it is).
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|e| storage(format!("creating {}: {e}", path.display())))?;
        }
        let db = redb::Builder::new()
            .set_cache_size(REDB_CACHE_BYTES)
            .create(path)
            .map_err(storage)?;
        let mut map = BTreeMap::new();
        let mut rev = 0;
        {
            let w = db.begin_write().map_err(storage)?;
            w.open_table(KV).map_err(storage)?;
            w.open_table(META).map_err(storage)?;
            w.commit().map_err(storage)?;
            let r = db.begin_read().map_err(storage)?;
            let t = r.open_table(KV).map_err(storage)?;
            for item in t.iter().map_err(storage)? {
                let (k, v) = item.map_err(storage)?;
                let (kv, key) = decode(k.value(), v.value(), &sealing.sealer)?;
                if is_sealed(&kv.key) {
                    sealing.ledger.note(&kv.key, key);
                }
                map.insert(kv.key.clone(), kv);
            }
            let m = r.open_table(META).map_err(storage)?;
            if let Some(v) = m.get("rev").map_err(storage)? {
                rev = v.value();
            }
        }
        let state = Arc::new(RwLock::new(State::new(map, rev)));
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(8192);
        let (events, published) = watch::channel(rev);
        let writer = {
            let (state, ledger) = (state.clone(), sealing.ledger.clone());
            thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || writer_loop(db, state, rx, events, ledger))
                .map_err(storage)?
        };
        Ok(Kv {
            state,
            tx,
            published,
            writer: Arc::new(std::sync::Mutex::new(Some(writer))),
            sealing,
        })
    }

    /// The keys and the ledger of sealed objects.
    pub(crate) fn sealing(&self) -> &Sealing {
        &self.sealing
    }

    /// The current (latest committed) revision.
    pub(crate) fn revision(&self) -> Rev {
        self.state.read().unwrap().rev
    }

    pub(crate) fn get(&self, key: &str) -> Option<KeyValue> {
        self.state.read().unwrap().map.get(key).cloned()
    }

    /// Every key with `prefix`, in key order, and the revision the list was read at.
    pub(crate) fn list(&self, prefix: &str) -> (Vec<KeyValue>, Rev) {
        self.state.read().unwrap().range(prefix)
    }

    /// Visit every key with `prefix` without cloning the list (read lock held).
    pub(crate) fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, f: F) -> Rev {
        self.state.read().unwrap().scan(prefix, f)
    }

    /// Commit `ops` atomically (waits until durable).
    pub(crate) async fn txn(&self, ops: Vec<Op>) -> Result<TxnResult, KvError> {
        let (reply, rx) = oneshot::channel();
        let tx = self.tx.clone();
        let texts = prepare(&ops, &self.sealing.sealer, |_| None)?;
        // The queue is bounded; a full queue must not block the async runtime.
        match tx.try_send(Msg::Txn(Request { ops, texts, reply })) {
            Ok(()) => {}
            Err(std::sync::mpsc::TrySendError::Full(req)) => {
                tokio::task::spawn_blocking(move || tx.send(req))
                    .await
                    .map_err(|_| KvError::Closed)?
                    .map_err(|_| KvError::Closed)?;
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err(KvError::Closed),
        }
        rx.await.map_err(|_| KvError::Closed)?
    }

    /// Blocking variant of [`Kv::txn`] for non-async callers.
    pub fn txn_blocking(&self, ops: Vec<Op>) -> Result<TxnResult, KvError> {
        let (reply, rx) = oneshot::channel();
        let texts = prepare(&ops, &self.sealing.sealer, |_| None)?;
        self.tx
            .send(Msg::Txn(Request { ops, texts, reply }))
            .map_err(|_| KvError::Closed)?;
        rx.blocking_recv().map_err(|_| KvError::Closed)?
    }

    /// Watch keys with `prefix` for changes after revision `from`. A `from` after the
    /// current revision is refused (`FutureRevision`): nothing could say when, or
    /// whether, that revision will be written.
    pub(crate) fn watch(&self, prefix: &str, from: Rev) -> Result<Watch, KvError> {
        Watch::open(&self.state, &self.published, prefix, from, None)
    }

    /// Stop the writer after it has committed everything queued before this call,
    /// and close the database. Later transactions fail with [`KvError::Closed`].
    pub(crate) fn close(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Msg::Close(reply)).is_ok() {
            let _ = rx.blocking_recv();
        }
        if let Some(h) = self.writer.lock().unwrap().take() {
            let _ = h.join();
        }
    }
}

/// A stream of events after a revision, for keys with a prefix. It reads the replay
/// log whenever the writer publishes a revision, so it holds no history of its own
/// beyond the events it has taken and not yet returned.
pub struct Watch {
    prefix: String,
    backlog: VecDeque<Event>,
    /// Every event up to this revision has been taken from the log.
    seen: Rev,
    state: Arc<RwLock<State>>,
    rx: watch::Receiver<Rev>,
}

impl Watch {
    /// A watch of `prefix` after `from` over `state`, woken by `published`. A `from`
    /// after the state's revision is refused, unless it is at most `known` (a revision
    /// the backend knows was committed and will reach the state): that watch waits.
    pub(crate) fn open(
        state: &Arc<RwLock<State>>,
        published: &watch::Receiver<Rev>,
        prefix: &str,
        from: Rev,
        known: Option<Rev>,
    ) -> Result<Watch, KvError> {
        let st = state.read().unwrap();
        if from > st.rev && known.is_none_or(|k| from > k) {
            return Err(KvError::FutureRevision {
                requested: from,
                current: known.unwrap_or(st.rev).max(st.rev),
            });
        }
        if from < st.oldest_watchable {
            return Err(KvError::Compacted {
                requested: from,
                oldest: st.oldest_watchable,
            });
        }
        let mut rx = published.clone();
        rx.mark_unchanged();
        let mut w = Watch {
            prefix: prefix.to_string(),
            backlog: VecDeque::new(),
            seen: from,
            state: state.clone(),
            rx,
        };
        w.read_log(&st)?;
        Ok(w)
    }

    /// Take this watch's events after `seen` from the log. `Err(Lagged)` when some of
    /// them have already left it.
    fn read_log(&mut self, st: &State) -> Result<(), KvError> {
        if st.rev <= self.seen {
            return Ok(());
        }
        if self.seen < st.oldest_watchable {
            return Err(KvError::Lagged);
        }
        let start = st.log.partition_point(|e| e.rev() <= self.seen);
        self.backlog.extend(
            st.log
                .range(start..)
                .filter(|e| e.kv.key.starts_with(&self.prefix))
                .cloned(),
        );
        self.seen = st.rev;
        Ok(())
    }

    /// The next event, in revision order. `Err(Lagged)` if this watcher fell more than
    /// [`EVENT_LOG_CAP`] events behind; `Err(Closed)` when the store shut down.
    pub(crate) async fn next(&mut self) -> Result<Event, KvError> {
        loop {
            if let Some(e) = self.backlog.pop_front() {
                return Ok(e);
            }
            // Marked seen before the log is read: a revision published after the read
            // wakes `changed` below, one published before it is in what was read.
            self.rx.mark_unchanged();
            let state = self.state.clone();
            self.read_log(&state.read().unwrap())?;
            if self.backlog.is_empty() && self.rx.changed().await.is_err() {
                return Err(KvError::Closed);
            }
        }
    }
}

/// The redb engine as the store's backend: each operation is the inherent one
/// (static dispatch, inlined).
impl KvBackend for Kv {
    type Watch = Watch;

    #[inline]
    fn revision(&self) -> Rev {
        Kv::revision(self)
    }

    #[inline]
    fn get(&self, key: &str) -> Option<KeyValue> {
        Kv::get(self, key)
    }

    #[inline]
    fn range(&self, prefix: &str) -> (Vec<KeyValue>, Rev) {
        Kv::list(self, prefix)
    }

    #[inline]
    fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, f: F) -> Rev {
        Kv::scan(self, prefix, f)
    }

    #[inline]
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<TxnResult, KvError>> + Send {
        Kv::txn(self, ops)
    }

    #[inline]
    fn watch(&self, prefix: &str, from: Rev) -> Result<Watch, KvError> {
        Kv::watch(self, prefix, from)
    }

    #[inline]
    fn close(&self) {
        Kv::close(self)
    }

    fn sealing(&self) -> &Sealing {
        Kv::sealing(self)
    }
}

impl KvWatch for Watch {
    #[inline]
    fn next(&mut self) -> impl Future<Output = Result<Event, KvError>> + Send {
        Watch::next(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn test_sealer(dir: &Path) -> Sealer {
        Sealer::load(&dir.join("secrets.key")).unwrap()
    }

    fn obj(n: i64) -> Value {
        json!({"metadata": {"name": "x"}, "n": n})
    }

    #[tokio::test]
    async fn cas_and_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::open(&dir.path().join("db"), test_sealer(dir.path())).unwrap();
        let r1 = kv
            .txn(vec![Op::put("/a", Compare::Absent, obj(1))])
            .await
            .unwrap();
        assert_eq!(r1.rev, 1);
        assert_eq!(
            kv.get("/a").unwrap().value()["metadata"]["resourceVersion"],
            "1"
        );
        let err = kv
            .txn(vec![Op::put("/a", Compare::Absent, obj(2))])
            .await
            .unwrap_err();
        assert!(matches!(err, KvError::AlreadyExists { .. }));
        let err = kv
            .txn(vec![Op::put("/a", Compare::ModRev(7), obj(2))])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            KvError::Conflict {
                key: "/a".into(),
                expected: 7,
                actual: 1
            }
        );
        let r2 = kv
            .txn(vec![Op::put("/a", Compare::ModRev(1), obj(2))])
            .await
            .unwrap();
        assert_eq!(r2.rev, 2);
        let a = kv.get("/a").unwrap();
        assert_eq!((a.create_rev, a.mod_rev), (1, 2));
        // A failed op aborts the whole transaction.
        let err = kv
            .txn(vec![
                Op::put("/b", Compare::Absent, obj(1)),
                Op::delete("/zz", Compare::Any),
            ])
            .await
            .unwrap_err();
        assert!(matches!(err, KvError::NotFound { .. }));
        assert!(kv.get("/b").is_none());
        assert_eq!(kv.revision(), 2);
    }

    #[tokio::test]
    async fn survives_reopen_and_revisions_keep_growing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let kv = Kv::open(&path, test_sealer(dir.path())).unwrap();
            for i in 0..10 {
                kv.txn(vec![Op::put(format!("/k/{i}"), Compare::Absent, obj(i))])
                    .await
                    .unwrap();
            }
            kv.txn(vec![Op::delete("/k/3", Compare::Exists)])
                .await
                .unwrap();
            let kv2 = kv.clone();
            tokio::task::spawn_blocking(move || kv2.close())
                .await
                .unwrap();
            assert_eq!(
                kv.txn(vec![Op::put("/late", Compare::Any, obj(0))])
                    .await
                    .unwrap_err(),
                KvError::Closed
            );
        }
        let kv = Kv::open(&path, test_sealer(dir.path())).unwrap();
        assert_eq!(kv.revision(), 11);
        let (items, rev) = kv.list("/k/");
        assert_eq!((items.len(), rev), (9, 11));
        let r = kv
            .txn(vec![Op::put("/k/3", Compare::Absent, obj(3))])
            .await
            .unwrap();
        assert_eq!(r.rev, 12);
        // History is not persisted: an old revision is compacted after restart.
        assert!(matches!(kv.watch("/", 5), Err(KvError::Compacted { .. })));
    }

    #[tokio::test]
    async fn watch_replays_then_follows_in_order_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::open(&dir.path().join("db"), test_sealer(dir.path())).unwrap();
        for i in 0..50 {
            kv.txn(vec![Op::put(format!("/w/{}", i % 7), Compare::Any, obj(i))])
                .await
                .unwrap();
        }
        let mut w = kv.watch("/w/", 20).unwrap();
        let writer = {
            let kv = kv.clone();
            tokio::spawn(async move {
                for i in 50..200 {
                    kv.txn(vec![Op::put(format!("/w/{}", i % 7), Compare::Any, obj(i))])
                        .await
                        .unwrap();
                    kv.txn(vec![Op::put("/other", Compare::Any, obj(i))])
                        .await
                        .unwrap();
                }
            })
        };
        let mut seen = Vec::new();
        while seen.len() < 180 {
            let e = w.next().await.unwrap();
            seen.push(e.kv.value()["n"].as_i64().unwrap());
        }
        writer.await.unwrap();
        assert_eq!(seen, (20..200).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn concurrent_cas_has_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::open(&dir.path().join("db"), test_sealer(dir.path())).unwrap();
        kv.txn(vec![Op::put("/s", Compare::Absent, obj(0))])
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..64 {
            let kv = kv.clone();
            tasks.push(tokio::spawn(async move {
                kv.txn(vec![Op::put("/s", Compare::ModRev(1), obj(i))])
                    .await
                    .is_ok()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += t.await.unwrap() as usize;
        }
        assert_eq!(wins, 1);
    }

    #[tokio::test]
    async fn text_keeps_field_order_and_recent_writes_share_their_value() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::open(&dir.path().join("db"), test_sealer(dir.path())).unwrap();
        let v = json!({"z": 1, "metadata": {"name": "x"}, "a": {"y": [1, "two"], "b": null}});
        let r = kv
            .txn(vec![Op::put("/h", Compare::Absent, v)])
            .await
            .unwrap();
        let written = r.values[0].clone().unwrap();
        let kv1 = kv.get("/h").unwrap();
        assert_eq!(
            &*kv1.raw,
            r#"{"z":1,"metadata":{"name":"x","resourceVersion":"1"},"a":{"y":[1,"two"],"b":null}}"#
        );
        assert!(
            Arc::ptr_eq(&kv1.value(), &written),
            "a hot read shares the value"
        );
        let writes: Vec<_> = (0..HOT_WRITES)
            .map(|i| {
                kv.txn(vec![Op::put(
                    format!("/o/{i}"),
                    Compare::Any,
                    obj(i as i64),
                )])
            })
            .collect();
        for w in futures::future::join_all(writes).await {
            w.unwrap();
        }
        let cold = kv.get("/h").unwrap().value();
        assert!(!Arc::ptr_eq(&cold, &written), "no longer hot: parsed");
        assert_eq!(*cold, *written);
        let keys: Vec<&String> = cold.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["z", "metadata", "a"]);
    }

    #[tokio::test]
    async fn a_watcher_further_behind_than_the_log_is_told_to_relist() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::open(&dir.path().join("db"), test_sealer(dir.path())).unwrap();
        kv.txn(vec![Op::put("/w/0", Compare::Any, obj(0))])
            .await
            .unwrap();
        let mut w = kv.watch("/w/", 1).unwrap();
        let writes: Vec<_> = (0..EVENT_LOG_CAP + 10)
            .map(|i| {
                kv.txn(vec![Op::put(
                    format!("/w/{}", i % 100),
                    Compare::Any,
                    obj(i as i64),
                )])
            })
            .collect();
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
        assert_eq!(w.next().await.unwrap_err(), KvError::Lagged);
        assert!(matches!(kv.watch("/w/", 1), Err(KvError::Compacted { .. })));
        // From a recent revision, replay then live events, as before.
        let rev = kv.revision();
        let mut w = kv.watch("/w/", rev - 1).unwrap();
        assert_eq!(w.next().await.unwrap().rev(), rev);
        kv.txn(vec![Op::put("/w/x", Compare::Any, obj(-1))])
            .await
            .unwrap();
        assert_eq!(w.next().await.unwrap().kv.value()["n"], -1);
    }
}
