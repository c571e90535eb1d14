//! The store on etcd: the [`KvBackend`] seam implemented on an etcd v3 cluster that
//! several appliances share (`[store] backend = "etcd"`, `[store.etcd]`).
//!
//! Shape: etcd is the truth; each appliance keeps a **mirror** of every object key
//! (`{prefix}objects/...`) in memory, the same [`State`] the embedded engine keeps
//! (map, replay log, revision), fed by one etcd watch. Reads (`get`, `range`, `scan`)
//! and watches are served from the mirror, so the boot side, the controllers and the
//! API's lists never wait on the network and keep answering while etcd is
//! unreachable. Writes go to etcd:
//! - a transaction is one etcd `Txn`: each op's guard is an etcd compare (absent:
//!   `create_revision == 0`; exists: `create_revision > 0`; `mod_revision == r`), a
//!   delete is guarded by existence, and the else branch reads the compared keys so a
//!   failure names the key and the revision found, as the embedded engine does;
//! - `resourceVersion` is etcd's mod revision: objects are stored with an empty
//!   `metadata.resourceVersion` (kube's etcd3 layout) and stamped when read;
//! - a committed transaction returns once the mirror has caught up with its revision
//!   (read-your-writes on this appliance; bounded by `request_timeout_ms`);
//! - a **fence** (the leader key of a controller group's election) may be added to
//!   every transaction of a store clone: the write then also requires that key to
//!   still exist with the revision it was created at, so a leader that lost its lease
//!   (paused, partitioned) cannot write after another appliance took over.
//!
//! History: the mirror's replay log is the embedded engine's (the last
//! [`super::kv::EVENT_LOG_CAP`] events); a watch from an older revision gets
//! `Compacted` (410) and re-lists. When the mirror's own etcd watch is cut it resumes
//! from the next revision; when etcd compacted past it, the mirror lists again and
//! every local watcher is told to re-list.
//!
//! Sealed values (Secrets, BMCSecrets, APITokens; [`super::seal`]) are bound to the
//! etcd key's create revision and version after the write: every sealed put is
//! guarded by the previous mod revision (an unguarded one gets the mirror's as its
//! guard), and the mirror keeps each sealed key's version, so the binding is known
//! before the write. A create is bound to etcd's current revision (asked just before)
//! plus one; committed at another, it is bound again at once ([`EtcdKv::rebind`]). A value
//! whose binding is not what etcd holds (an older value put back), a legacy one after
//! the cluster's marker ([`marker`]) or an APIToken in clear is not served: the mirror
//! keeps what it had and says so in the log (a listing leaves the key out).
//!
//! Failure: every request to etcd is bounded by `request_timeout_ms`; with no
//! quorum the client's `require_leader` makes members refuse at once. Such a write
//! fails with [`KvError::Unavailable`] when it was not sent (503 at the API: nothing was
//! written) or [`KvError::OutcomeUnknown`] when it was and no answer came in time (504
//! `Timeout`: it may apply yet; read again); reads go on from the mirror.

pub mod client;
pub mod election;
pub mod keyring;
pub mod marker;
mod mirrored;
mod retry;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use etcd_client::{
    Compare as ECompare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::backend::{
    Action, Compare, Event, EventKind, KeyValue, KvBackend, KvError, Op, Rev, TxnResult,
};
use super::kv::text::{prepare, stamp};
use super::kv::{compare, Garbage, State, Watch};
use super::seal::{is_sealed, Binding, Sealer, Sealing};
use super::settings::EtcdConfig;
use mirrored::{left_out, mirror_kv, refused, OwnWrites};
use retry::{outcome_unknown, retrying, unavailable, Answer};

/// Keys read per page when listing (a page stays well under gRPC's message limit).
const LIST_PAGE: i64 = 500;
/// The largest gRPC message the client accepts (a watch response may batch events).
const MAX_MESSAGE: usize = 64 << 20;
/// Pause before the mirror's watch is opened again after it was cut.
const RESUME_MIN: Duration = Duration::from_millis(100);
const RESUME_MAX: Duration = Duration::from_secs(2);

/// A controller group's leadership: writes through a fenced store require this key
/// to exist with this create revision (see the module doc). A write refused by the
/// fence cancels `lost`: the leadership is over, whatever the lease renewal thinks.
#[derive(Debug, Clone)]
pub struct Fence {
    pub key: Vec<u8>,
    pub create_rev: i64,
    lost: CancellationToken,
}

impl Fence {
    pub(crate) fn new(key: Vec<u8>, create_rev: i64, lost: CancellationToken) -> Fence {
        Fence {
            key,
            create_rev,
            lost,
        }
    }
}

/// The etcd backend. Cheap to clone; clones share one mirror and connection.
#[derive(Clone)]
pub struct EtcdKv {
    inner: Arc<Inner>,
    fence: Option<Arc<Fence>>,
}

struct Inner {
    client: etcd_client::Client,
    /// `{prefix}objects`: store keys (which start with `/`) are appended to it.
    root: String,
    state: Arc<RwLock<State>>,
    published: watch::Receiver<Rev>,
    /// The highest etcd revision any response carried (a watch may wait for one up
    /// to it: it was committed, so the mirror will reach it).
    known: AtomicU64,
    closed: AtomicBool,
    stop: CancellationToken,
    /// The mirror's task and the keyring follower's.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The cluster's keyring, when the keys come from it ([`keyring`]).
    keyring: Option<Arc<keyring::Follower>>,
    request_timeout: Duration,
    /// The keys Secrets are sealed with (the values etcd holds are encrypted), and
    /// which key each is stored under.
    sealing: Sealing,
    /// Each sealed key's (mod revision, etcd version) as the mirror holds it.
    versions: Versions,
    /// This appliance's committed puts, until their watch events take them.
    own: OwnWrites,
}

/// Each sealed key's (mod revision, etcd version) in the mirror: what the next write
/// of the key binds its value to ([`Binding`]).
type Versions = Mutex<HashMap<Arc<str>, (Rev, u64)>>;

/// `rev` as etcd's signed revision.
fn srev(rev: Rev) -> i64 {
    i64::try_from(rev).unwrap_or(i64::MAX)
}

fn urev(rev: i64) -> Rev {
    u64::try_from(rev).unwrap_or(0)
}

/// The first key after every key starting with `prefix` (etcd's prefix range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdKv {
    /// Connect, list every object into the mirror and start following the cluster.
    /// Fails when the cluster cannot be read within the request timeout (the caller
    /// says so and stops: an appliance does not start on an empty mirror), or when
    /// a sealed value opens with no key of `sealer`'s (naming the object and the key).
    pub async fn open(cfg: &EtcdConfig, sealer: Sealer) -> anyhow::Result<EtcdKv> {
        EtcdKv::open_keyed(cfg, sealer, None).await
    }

    /// [`EtcdKv::open`] with the keys from the cluster's keyring, followed by
    /// `keyring` ([`keyring::sealer_for`]).
    pub async fn open_keyed(
        cfg: &EtcdConfig,
        sealer: Sealer,
        keyring: Option<Arc<keyring::Follower>>,
    ) -> anyhow::Result<EtcdKv> {
        use anyhow::Context as _;
        let sealing = Sealing::new(sealer);
        let client = client::connect(cfg).await?;
        let root = format!("{}objects", cfg.prefix);
        let request_timeout = Duration::from_millis(cfg.request_timeout_ms);
        let versions = Versions::default();
        let listing = || {
            let l = list(&client, &root, &sealing, &versions);
            async move {
                tokio::time::timeout(request_timeout * 2, l)
                    .await
                    .map_err(|_| unavailable("timed out"))
                    .and_then(|r| r)
            }
        };
        let mut listed = listing().await;
        // A value sealed with a key rotated in since the keyring was read: read it again.
        if let (Err(KvError::Sealed(e)), Some(k)) = (&listed, &keyring) {
            if e.key_name().is_some() && k.refresh().await.unwrap_or(false) {
                listed = listing().await;
            }
        }
        let (map, rev) = listed
            .with_context(|| format!("listing {root} from etcd at {}", cfg.endpoints.join(",")))?;
        tracing::info!(objects = map.len(), rev, "store mirror loaded from etcd");
        let state = Arc::new(RwLock::new(State::new(map, rev)));
        let (events, published) = watch::channel(rev);
        let inner = Arc::new(Inner {
            client,
            root,
            state,
            published,
            known: AtomicU64::new(rev),
            closed: AtomicBool::new(false),
            stop: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
            keyring,
            request_timeout,
            sealing,
            versions,
            own: OwnWrites::default(),
        });
        let task = tokio::spawn(follow(inner.clone(), events));
        inner.tasks.lock().unwrap().push(task);
        if let Some(k) = &inner.keyring {
            let task = tokio::spawn(k.clone().run(inner.stop.clone()));
            inner.tasks.lock().unwrap().push(task);
        }
        Ok(EtcdKv { inner, fence: None })
    }

    /// A clone whose every transaction also requires `fence` (a controller group's
    /// leadership): see the module doc.
    pub(crate) fn fenced(&self, fence: Fence) -> EtcdKv {
        EtcdKv {
            inner: self.inner.clone(),
            fence: Some(Arc::new(fence)),
        }
    }

    /// The keys and the ledger of sealed objects.
    pub(crate) fn sealing(&self) -> &Sealing {
        &self.inner.sealing
    }

    /// The connection (for the election and the DHCP lease ledger).
    pub fn client(&self) -> &etcd_client::Client {
        &self.inner.client
    }

    fn etcd_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.root)
    }

    fn note_rev(&self, rev: i64) {
        self.inner.known.fetch_max(urev(rev), Ordering::Relaxed);
    }

    pub(crate) async fn txn(&self, ops: Vec<Op>) -> Result<TxnResult, KvError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(KvError::Closed);
        }
        let mut ops = ops;
        let bindings = self.bind(&mut ops).await?;
        let texts = prepare(&ops, &self.inner.sealing.sealer, |i| bindings[i])?;
        let mut when = Vec::with_capacity(ops.len() + 1);
        let mut then = Vec::with_capacity(ops.len());
        let mut otherwise = Vec::with_capacity(ops.len() + 1);
        for (op, text) in ops.iter().zip(&texts) {
            let k = self.etcd_key(&op.key);
            let guard = match (op.compare, &op.action) {
                (Compare::Absent, _) => {
                    Some(ECompare::create_revision(k.clone(), CompareOp::Equal, 0))
                }
                (Compare::Exists, _) | (Compare::Any, Action::Delete) => {
                    Some(ECompare::create_revision(k.clone(), CompareOp::Greater, 0))
                }
                (Compare::ModRev(r), _) => {
                    Some(ECompare::mod_revision(k.clone(), CompareOp::Equal, srev(r)))
                }
                (Compare::Any, Action::Put(_)) => None,
            };
            when.extend(guard);
            then.push(match (&op.action, text) {
                (Action::Put(_), Some(p)) => TxnOp::put(
                    k.clone(),
                    p.stored(),
                    Some(PutOptions::new().with_prev_key()),
                ),
                _ => TxnOp::delete(k.clone(), None),
            });
            otherwise.push(TxnOp::get(k, Some(GetOptions::new().with_keys_only())));
        }
        if let Some(f) = &self.fence {
            when.push(ECompare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.create_rev,
            ));
            otherwise.push(TxnOp::get(
                f.key.clone(),
                Some(GetOptions::new().with_keys_only()),
            ));
        }
        let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
        let kv = self.inner.client.kv_client();
        let Answer {
            value: resp,
            after_break,
        } = retrying(self.inner.request_timeout, || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.note_rev(rev);
        let answers = resp.op_responses();
        if !resp.succeeded() {
            if after_break {
                return Err(outcome_unknown());
            }
            return Err(self.failure(&ops, &answers));
        }
        let mut rev = urev(rev);
        let committed = rev;
        // Creates bound to a revision etcd did not give them: bound again at once.
        let unbound: Vec<(String, Arc<Value>)> = ops
            .iter()
            .zip(&bindings)
            .filter(|(_, b)| b.is_some_and(|b| b.version == 1 && b.create_rev != rev))
            .filter_map(|(op, _)| match &op.action {
                Action::Put(v) => Some((op.key.clone(), v.clone())),
                Action::Delete => None,
            })
            .collect();
        let mut rebound = HashMap::new();
        if !unbound.is_empty() {
            let (at, texts) = self.rebind(&unbound, rev).await?;
            rebound = texts;
            rev = at;
        }
        let mut kvs = Vec::with_capacity(ops.len());
        let mut values = Vec::with_capacity(ops.len());
        for ((op, text), answer) in ops.into_iter().zip(texts).zip(answers) {
            let text = rebound.remove(&op.key).unwrap_or(text);
            match (op.action, text) {
                (Action::Put(mut v), Some(p)) => {
                    stamp(Arc::make_mut(&mut v), rev);
                    let create_rev = match answer {
                        TxnOpResponse::Put(r) => r.prev_key().map(|p| urev(p.create_revision())),
                        _ => None,
                    }
                    .unwrap_or(committed);
                    kvs.push(Some(KeyValue {
                        key: Arc::from(op.key.as_str()),
                        raw: p.stamped(rev),
                        create_rev,
                        mod_rev: rev,
                        hot: None,
                    }));
                    values.push(Some(v));
                }
                _ => {
                    kvs.push(None);
                    values.push(None);
                }
            }
        }
        for (kv, v) in kvs.iter().zip(&values) {
            if let (Some(kv), Some(v)) = (kv, v) {
                self.inner.own.note(kv, v);
            }
        }
        // Read-your-writes: the mirror shows this revision before the caller goes on.
        let mut seen = self.inner.published.clone();
        let caught_up =
            tokio::time::timeout(self.inner.request_timeout, seen.wait_for(|r| *r >= rev)).await;
        if !matches!(caught_up, Ok(Ok(_))) {
            tracing::warn!(
                rev,
                "committed to etcd, but the mirror has not caught up yet"
            );
        }
        (self.inner.own).forget(kvs.iter().flatten().map(|kv| &kv.key), rev);
        Ok(TxnResult { rev, kvs, values })
    }

    /// The binding of each sealed put of `ops` (the key's create revision and version
    /// once it is written; see the module doc). An unguarded sealed put (`Any`,
    /// `Exists`) is guarded by the mirror's mod revision, so the version is known.
    async fn bind(&self, ops: &mut [Op]) -> Result<Vec<Option<Binding>>, KvError> {
        let sealed_put = |op: &Op| matches!(op.action, Action::Put(_)) && is_sealed(&op.key);
        if !ops.iter().any(sealed_put) {
            return Ok(vec![None; ops.len()]);
        }
        // A revision the caller read elsewhere (another appliance): let the mirror reach it.
        let want = ops
            .iter()
            .filter(|op| sealed_put(op))
            .filter_map(|op| match op.compare {
                Compare::ModRev(r) => Some(r),
                _ => None,
            })
            .max();
        if let Some(r) =
            want.filter(|r| *r > self.revision() && *r <= self.inner.known.load(Ordering::Relaxed))
        {
            let mut seen = self.inner.published.clone();
            let _ =
                tokio::time::timeout(self.inner.request_timeout, seen.wait_for(|x| *x >= r)).await;
        }
        // Creates bind the next revision; writes the mirror does not see (DHCP) move it.
        if ops
            .iter()
            .any(|op| sealed_put(op) && matches!(op.compare, Compare::Absent | Compare::Any))
        {
            self.learn_revision().await?;
        }
        let st = self.inner.state.read().unwrap();
        let versions = self.inner.versions.lock().unwrap();
        // What etcd gives the next write, when none lands elsewhere first.
        let next = self.inner.known.load(Ordering::Relaxed).max(st.rev()) + 1;
        ops.iter_mut()
            .map(|op| {
                if !sealed_put(op) {
                    return Ok(None);
                }
                let cur = st.get(&op.key);
                let not_found = || KvError::NotFound {
                    key: op.key.clone(),
                };
                op.compare = match (op.compare, cur) {
                    (Compare::Any | Compare::Exists, Some(c)) => Compare::ModRev(c.mod_rev),
                    (Compare::Any, None) => Compare::Absent,
                    (Compare::Exists, None) => return Err(not_found()),
                    (c, _) => c,
                };
                match (op.compare, cur) {
                    (Compare::ModRev(r), Some(c)) => match versions.get(&*c.key) {
                        Some(&(at, v)) if at == r && c.mod_rev == r => Ok(Some(Binding {
                            create_rev: c.create_rev,
                            version: v + 1,
                        })),
                        _ => Err(KvError::Conflict {
                            key: op.key.clone(),
                            expected: r,
                            actual: c.mod_rev,
                        }),
                    },
                    (Compare::ModRev(_), None) => Err(not_found()),
                    _ => Ok(Some(Binding {
                        create_rev: next,
                        version: 1,
                    })),
                }
            })
            .collect()
    }

    /// Ask etcd for its current revision (a count-only read): [`Inner::known`].
    async fn learn_revision(&self) -> Result<(), KvError> {
        let mut kv = self.inner.client.kv_client();
        let opts = GetOptions::new().with_count_only();
        let key = self.inner.root.clone();
        let r = tokio::time::timeout(self.inner.request_timeout, kv.get(key, Some(opts))).await;
        let got = r
            .map_err(|_| unavailable("timed out"))?
            .map_err(unavailable)?;
        if let Some(h) = got.header() {
            self.note_rev(h.revision());
        }
        Ok(())
    }

    /// Put `puts` (sealed creates committed at `created`, bound to another revision, so
    /// opened nowhere) again bound to (`created`, 2), guarded: the revision and texts.
    async fn rebind(
        &self,
        puts: &[(String, Arc<Value>)],
        created: Rev,
    ) -> Result<(Rev, HashMap<String, Option<super::kv::text::Prepared>>), KvError> {
        let ops: Vec<Op> = puts
            .iter()
            .map(|(k, v)| Op::put(k.clone(), Compare::ModRev(created), (**v).clone()))
            .collect();
        let bound = Binding {
            create_rev: created,
            version: 2,
        };
        let texts = prepare(&ops, &self.inner.sealing.sealer, |_| Some(bound))?;
        let mut when = Vec::with_capacity(ops.len() + 1);
        let mut then = Vec::with_capacity(ops.len());
        for (op, text) in ops.iter().zip(&texts) {
            let k = self.etcd_key(&op.key);
            when.push(ECompare::mod_revision(
                k.clone(),
                CompareOp::Equal,
                srev(created),
            ));
            let stored = text
                .as_ref()
                .map(|p| p.stored().to_vec())
                .unwrap_or_default();
            then.push(TxnOp::put(k, stored, None));
        }
        if let Some(f) = &self.fence {
            when.push(ECompare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.create_rev,
            ));
        }
        let txn = Txn::new().when(when).and_then(then);
        let kv = self.inner.client.kv_client();
        let Answer {
            value: resp,
            after_break,
        } = retrying(self.inner.request_timeout, || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.note_rev(rev);
        if !resp.succeeded() {
            if after_break {
                return Err(outcome_unknown());
            }
            // Changed in between (the created value opened nowhere): the create failed.
            return Err(KvError::Conflict {
                key: ops[0].key.clone(),
                expected: created,
                actual: 0,
            });
        }
        tracing::debug!(
            created,
            rev = urev(rev),
            keys = ops.len(),
            "sealed creates bound again to their create revision"
        );
        let texts = ops.into_iter().map(|op| op.key).zip(texts).collect();
        Ok((urev(rev), texts))
    }

    /// Write the cluster's sealing marker when it is due ([`marker::due`]).
    pub async fn settle_sealing(&self) -> Result<bool, KvError> {
        let sealing = &self.inner.sealing;
        if !marker::due(sealing) {
            return Ok(false);
        }
        let (value, name) = marker::value(sealing);
        let mut kv = self.inner.client.kv_client();
        let key = self.etcd_key(marker::KEY);
        let r = tokio::time::timeout(self.inner.request_timeout, kv.put(key, value, None)).await;
        let put = r
            .map_err(|_| unavailable("timed out"))?
            .map_err(unavailable)?;
        if let Some(h) = put.header() {
            self.note_rev(h.revision());
        }
        if !sealing.strict() {
            tracing::info!(key = %name, "every sealed value is bound to its etcd key's create revision and version: the cluster's sealing marker is written, legacy sealed values are refused from now on");
        }
        sealing.set_marker(name);
        Ok(true)
    }

    /// The error of a transaction whose guards failed: the first op whose guard the
    /// else branch's reads refute, or the fence.
    fn failure(&self, ops: &[Op], answers: &[TxnOpResponse]) -> KvError {
        let found = |i: usize| -> Option<KeyValue> {
            match answers.get(i) {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| KeyValue {
                    key: Arc::from(""),
                    raw: Arc::from(""),
                    create_rev: urev(kv.create_revision()),
                    mod_rev: urev(kv.mod_revision()),
                    hot: None,
                }),
                _ => None,
            }
        };
        for (i, op) in ops.iter().enumerate() {
            if let Err(e) = compare(op, found(i).as_ref()) {
                return e;
            }
        }
        if let Some(f) = &self.fence {
            if found(ops.len()).is_none_or(|kv| srev(kv.create_rev) != f.create_rev) {
                f.lost.cancel();
                return KvError::Fenced;
            }
        }
        // The guards held when read back: a write landed between the two (the
        // caller retries as for any conflict).
        KvError::Conflict {
            key: ops.first().map(|o| o.key.clone()).unwrap_or_default(),
            expected: 0,
            actual: 0,
        }
    }

    pub(crate) fn watch(&self, prefix: &str, from: Rev) -> Result<Watch, KvError> {
        let known = self.inner.known.load(Ordering::Relaxed);
        Watch::open(
            &self.inner.state,
            &self.inner.published,
            prefix,
            from,
            Some(known),
        )
    }

    /// Stop following etcd: later transactions fail with `Closed`, watchers end.
    /// Blocking (waits for the mirror's task).
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.stop.cancel();
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().unwrap());
        for t in tasks {
            let _ = futures::executor::block_on(t);
        }
    }
}

/// Every key under `root` at one revision, a page at a time; the ledger is rebuilt.
async fn list(
    client: &etcd_client::Client,
    root: &str,
    sealing: &Sealing,
    versions: &Versions,
) -> Result<(BTreeMap<Arc<str>, KeyValue>, Rev), KvError> {
    sealing.ledger.reset(Default::default());
    versions.lock().unwrap().clear();
    let kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
    // The marker first: it decides how the values listed before it open.
    let key = format!("{root}{}", marker::KEY);
    let got = retrying(Duration::from_secs(5), || {
        let (mut kv, key) = (kv.clone(), key.clone());
        async move { kv.get(key, None).await }
    })
    .await?
    .value;
    if let Some(m) = got.kvs().first() {
        marker::seen(sealing, m.value());
    }
    let end = prefix_end(root.as_bytes());
    let mut from = root.as_bytes().to_vec();
    let mut rev = 0i64;
    let mut map = BTreeMap::new();
    loop {
        let mut opts = GetOptions::new()
            .with_range(end.clone())
            .with_limit(LIST_PAGE);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let page = retrying(Duration::from_secs(5), || {
            let (mut kv, from, opts) = (kv.clone(), from.clone(), opts.clone());
            async move { kv.get(from, Some(opts)).await }
        })
        .await?
        .value;
        if rev == 0 {
            rev = page.header().map(|h| h.revision()).unwrap_or(0);
        }
        for e in page.kvs() {
            match mirror_kv(root, e, false, sealing, versions) {
                Ok(Some(m)) => {
                    map.insert(m.key.clone(), m);
                }
                Ok(None) => {}
                Err(e) if left_out(&e) => refused(&e),
                Err(e) => return Err(e.into()),
            }
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((map, urev(rev)))
}

/// The mirror's task: follow the object keys from the listing's revision, publish
/// each revision's changes, resume after a cut, re-list after a compaction.
async fn follow(inner: Arc<Inner>, events: watch::Sender<Rev>) {
    let mut pause = RESUME_MIN;
    loop {
        let from = inner.state.read().unwrap().rev();
        let outcome = tokio::select! {
            _ = inner.stop.cancelled() => break,
            r = watch_from(&inner, &events, from) => r,
        };
        match outcome {
            Ok(()) => pause = RESUME_MIN,
            Err(Cut::Compacted) => {
                tracing::warn!(from, "etcd compacted past the mirror; listing again");
                let listed = tokio::select! {
                    _ = inner.stop.cancelled() => break,
                    r = list(&inner.client, &inner.root, &inner.sealing, &inner.versions) => r,
                };
                match listed {
                    Ok((map, rev)) => {
                        let mut garbage = Garbage::default();
                        inner.state.write().unwrap().reset(map, rev, &mut garbage);
                        inner.known.fetch_max(rev, Ordering::Relaxed);
                        events.send_replace(rev);
                        drop(garbage);
                        pause = RESUME_MIN;
                        continue;
                    }
                    Err(e) => tracing::warn!(error = %e, "listing etcd again failed"),
                }
            }
            Err(Cut::Failed(e)) => tracing::warn!(error = %e, from, "etcd watch cut; resuming"),
        }
        tokio::select! {
            _ = inner.stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RESUME_MAX);
    }
    // Dropping `events` ends every local watcher (`Closed`).
}

enum Cut {
    Compacted,
    Failed(String),
}

/// Watch the root after `from` and publish until the stream ends.
async fn watch_from(inner: &Inner, events: &watch::Sender<Rev>, from: Rev) -> Result<(), Cut> {
    let root = inner.root.as_bytes();
    let opts = WatchOptions::new()
        .with_range(prefix_end(root))
        .with_start_revision(srev(from + 1));
    let mut wc = inner
        .client
        .watch_client()
        .max_decoding_message_size(MAX_MESSAGE);
    let mut stream = wc
        .watch(root.to_vec(), Some(opts))
        .await
        .map_err(|e| Cut::Failed(e.to_string()))?;
    loop {
        let Some(resp) = stream
            .message()
            .await
            .map_err(|e| Cut::Failed(e.to_string()))?
        else {
            return Err(Cut::Failed("stream ended".into()));
        };
        if resp.compact_revision() > 0 {
            return Err(Cut::Compacted);
        }
        if resp.canceled() {
            return Err(Cut::Failed(format!(
                "watch canceled: {}",
                resp.cancel_reason()
            )));
        }
        if let Some(h) = resp.header() {
            inner.known.fetch_max(urev(h.revision()), Ordering::Relaxed);
        }
        // A value sealed with a key this appliance does not hold yet: another
        // appliance took a rotated keyring first; read this one's before applying.
        if let Some(k) = &inner.keyring {
            let sealer = &inner.sealing.sealer;
            if let Some(name) = resp
                .events()
                .iter()
                .filter_map(|e| e.kv())
                .find_map(|kv| sealer.unknown_key(kv.value()))
            {
                tracing::info!(key = %name, "a sealed value names a key this appliance does not hold: reading its keyring record");
                k.refreshed().await;
            }
        }
        apply(inner, events, resp.events());
    }
}

/// Publish a watch response's events, one revision at a time.
fn apply(inner: &Inner, events: &watch::Sender<Rev>, evs: &[etcd_client::Event]) {
    let mut i = 0;
    while i < evs.len() {
        let rev = evs[i].kv().map(|kv| kv.mod_revision()).unwrap_or(0);
        let mut j = i;
        while j < evs.len() && evs[j].kv().map(|kv| kv.mod_revision()).unwrap_or(0) == rev {
            j += 1;
        }
        let mut garbage = Garbage::default();
        {
            let mut st = inner.state.write().unwrap();
            let rev = urev(rev);
            if rev <= st.rev() {
                i = j;
                continue;
            }
            let mut changes = Vec::with_capacity(j - i);
            let mut out = Vec::with_capacity(j - i);
            for e in &evs[i..j] {
                let Some(kv) = e.kv() else { continue };
                match e.event_type() {
                    EventType::Put => {
                        let with = (&inner.sealing, &inner.versions);
                        let m = mirrored::event_kv(&inner.root, kv, &inner.own, with)
                            .unwrap_or_else(|e| {
                                refused(&e);
                                None
                            });
                        if let Some(m) = m {
                            // New here: also a create bound again, or a key left out.
                            let existed = st.get(&m.key).is_some();
                            changes.push((m.key.clone(), Some(m.clone())));
                            out.push(Event {
                                kind: EventKind::Put,
                                kv: m,
                                existed,
                            });
                        }
                    }
                    EventType::Delete => {
                        let Some(key) = kv
                            .key_str()
                            .ok()
                            .and_then(|k| k.strip_prefix(inner.root.as_str()))
                        else {
                            continue;
                        };
                        if key == marker::KEY {
                            marker::deleted(&inner.sealing);
                        }
                        if is_sealed(key) {
                            inner.sealing.ledger.remove(key);
                            inner.versions.lock().unwrap().remove(key);
                        }
                        if let Some(prev) = st.get(key).cloned() {
                            changes.push((prev.key.clone(), None));
                            out.push(Event {
                                kind: EventKind::Delete,
                                kv: KeyValue {
                                    mod_rev: rev,
                                    ..prev
                                },
                                existed: true,
                            });
                        }
                    }
                }
            }
            st.publish(changes, out, rev, &mut garbage);
        }
        events.send_replace(urev(rev));
        drop(garbage);
        i = j;
    }
}

impl KvBackend for EtcdKv {
    type Watch = Watch;

    fn revision(&self) -> Rev {
        self.inner.state.read().unwrap().rev()
    }

    fn get(&self, key: &str) -> Option<KeyValue> {
        self.inner.state.read().unwrap().get(key).cloned()
    }

    fn range(&self, prefix: &str) -> (Vec<KeyValue>, Rev) {
        self.inner.state.read().unwrap().range(prefix)
    }

    fn scan<F: FnMut(&KeyValue)>(&self, prefix: &str, f: F) -> Rev {
        self.inner.state.read().unwrap().scan(prefix, f)
    }

    fn txn(
        &self,
        ops: Vec<Op>,
    ) -> impl std::future::Future<Output = Result<TxnResult, KvError>> + Send {
        EtcdKv::txn(self, ops)
    }

    fn watch(&self, prefix: &str, from: Rev) -> Result<Watch, KvError> {
        EtcdKv::watch(self, prefix, from)
    }

    fn close(&self) {
        EtcdKv::close(self)
    }

    fn sealing(&self) -> &Sealing {
        EtcdKv::sealing(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
