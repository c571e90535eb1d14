//! The object store: Kubernetes object semantics on top of a revisioned key-value
//! backend with etcd's semantics ([`backend::KvBackend`]; the redb engine [`kv`] is
//! the only one today). This is where `metadata` is owned: `uid`,
//! `creationTimestamp`, `generation`, `resourceVersion` (= the KV `mod_rev`),
//! finalizers and `deletionTimestamp`, and cascading deletion of dependents named
//! by `ownerReferences`. Every write is validated against the type's schema first
//! (`validate.rs`). [`watcher`] is the list → watch → re-list loop over it.
//!
//! Controllers and the REST API both go through [`Store`]; nothing else writes the KV.
//!
//! Objects come back as `Arc<serde_json::Value>`, parsed from the KV's JSON text on
//! each read (shared with the writer for the last writes, see [`kv`]); callers that
//! keep objects for long should keep only the fields they need. Callers that only
//! pass objects on as JSON take the stored text ([`Store::get_text`],
//! [`Store::list_text`], [`ObjectEvent::text`]); writers that hold the object they
//! read update against it ([`Store::update_status`], [`Store::update_from`]).

pub mod backend;
pub mod engine;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod events;
pub mod keyring;
pub mod kv;
pub mod metrics;
pub mod migrate;
pub mod modify;
mod page;
pub mod rotate;
pub mod seal;
pub mod settings;
mod together;
mod unique;
mod validate;
pub mod watcher;

pub use page::Page;
pub use together::Write;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use backend::{KvBackend, KvWatch};
use bootplane_model::meta;
use bootplane_model::registry::{Registry, ResourceType};
use bootplane_model::schema::{FieldError, Reason};
use bootplane_model::selector::Selector;
pub use engine::Backend;
use kv::{Compare, EventKind, Kv, KvError, Op, Rev};
pub use modify::{retry_on_conflict, Modified};
use validate::{err_invalid, field};

/// Errors callers branch on; the REST API maps each to one HTTP status.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum StoreError {
    #[error("{qualified} \"{name}\" not found")]
    NotFound { qualified: String, name: String },
    #[error("{qualified} \"{name}\" already exists")]
    AlreadyExists { qualified: String, name: String },
    #[error("Operation cannot be fulfilled on {qualified} \"{name}\": {message}")]
    Conflict {
        qualified: String,
        name: String,
        message: String,
    },
    #[error("{kind} \"{name}\" is invalid: {}", causes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))]
    Invalid {
        kind: String,
        name: String,
        causes: Vec<FieldError>,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Gone(String),
    /// A watch from a revision not written yet (kube's "too large resource version").
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: Rev, current: Rev },
    /// An object whose stored text would be over [`kv::MAX_VALUE_BYTES`].
    #[error("{qualified} \"{name}\" is too large: {size} bytes, limit is {limit}")]
    TooLarge {
        qualified: String,
        name: String,
        size: usize,
        limit: usize,
    },
    /// The store cannot take writes now (etcd unreachable or without quorum, or
    /// this appliance's leadership fenced): retry later (503).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A write that reached etcd got no answer in time (or its connection broke under
    /// it): it may have been applied, or may still be (504 `Timeout`, as kube's). Read
    /// the object again before retrying.
    #[error("store did not answer in time: {0}: the write may have been applied, or may still be; read it again before retrying")]
    OutcomeUnknown(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub(crate) type Result<T> = std::result::Result<T, StoreError>;

/// Which part of an object an update may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// metadata + spec (status is kept from the stored object).
    Main,
    /// status only (the `/status` subresource).
    Status,
}

/// A change seen by a watch.
#[derive(Debug, Clone)]
pub struct ObjectEvent {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub object: Arc<Value>,
    /// `object`'s compact JSON text as stored (for `ADDED`/`MODIFIED`), which the REST
    /// watch writes as is. `None` for `DELETED`, whose text carries the revision
    /// before the deletion.
    pub text: Option<Arc<str>>,
    pub rev: Rev,
}

/// A listing's objects, parsed as they are taken (see [`Store::list`]).
pub struct Objects<'a> {
    kvs: std::vec::IntoIter<kv::KeyValue>,
    sel: Option<&'a Selector>,
}

impl Iterator for Objects<'_> {
    type Item = Arc<Value>;

    fn next(&mut self) -> Option<Arc<Value>> {
        let sel = self.sel;
        self.kvs
            .by_ref()
            .map(|kv| kv.value())
            .find(|v| sel.is_none_or(|s| s.matches(meta::labels(v))))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, self.kvs.size_hint().1)
    }
}

/// A watch of one type's objects (over the backend's key watch).
pub struct ObjectWatch<W = kv::Watch> {
    inner: W,
}

impl<W: KvWatch> ObjectWatch<W> {
    pub async fn next(&mut self) -> Result<ObjectEvent> {
        let e = self.inner.next().await.map_err(map_kv)?;
        let kind = match (e.kind, e.existed) {
            (EventKind::Delete, _) => "DELETED",
            (EventKind::Put, false) => "ADDED",
            (EventKind::Put, true) => "MODIFIED",
        };
        let rev = e.rev();
        let mut object = e.kv.value();
        let mut text = Some(e.kv.raw);
        if e.kind == EventKind::Delete {
            text = None;
            if let Some(Value::Object(m)) = Arc::make_mut(&mut object).get_mut("metadata") {
                m.insert("resourceVersion".into(), Value::String(rev.to_string()));
            }
        }
        Ok(ObjectEvent {
            kind,
            object,
            text,
            rev,
        })
    }
}

fn map_kv(e: KvError) -> StoreError {
    match e {
        KvError::Compacted { requested, oldest } => {
            StoreError::Gone(format!("too old resource version: {requested} ({oldest})"))
        }
        KvError::Lagged => StoreError::Gone("watch closed: client too slow, re-list".into()),
        KvError::FutureRevision { requested, current } => {
            StoreError::TooLargeResourceVersion { requested, current }
        }
        KvError::TooLarge { key, size, limit } => StoreError::TooLarge {
            qualified: "object".into(),
            name: key,
            size,
            limit,
        },
        e @ (KvError::Unavailable(_) | KvError::Fenced) => StoreError::Unavailable(e.to_string()),
        KvError::OutcomeUnknown(m) => StoreError::OutcomeUnknown(m),
        other => StoreError::Internal(other.to_string()),
    }
}

/// [`map_kv`] for a write of `rt` `name`: a value over the size limit names the object.
fn map_write(rt: &ResourceType, name: &str, e: KvError) -> StoreError {
    match e {
        KvError::TooLarge { size, limit, .. } => StoreError::TooLarge {
            qualified: rt.qualified(),
            name: name.into(),
            size,
            limit,
        },
        other => map_kv(other),
    }
}

/// What one [`Store::reseal`] pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    pub rewritten: usize,
    /// Deleted or changed meanwhile, or not readable here: left for the next pass.
    pub skipped: usize,
}

/// The current time as the RFC 3339 string (seconds, `Z`) used in metadata and status.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The object store. Cheap to clone.
#[derive(Clone)]
pub struct Store<B = Backend> {
    kv: B,
    reg: &'static Registry,
    /// Servers' MACs and UUIDs for the uniqueness check ([`unique`]).
    unique: Arc<unique::Cache>,
    /// Writes are checked and answered but not committed ([`Store::dry_run`]).
    dry: bool,
}

impl Store {
    /// Open the embedded store in `dir` (created if needed), on the redb engine, with
    /// the default key file (`dir/secrets.key`, created if needed).
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        use anyhow::Context;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let sealer = seal::Sealer::load(&dir.join(settings::DEFAULT_KEY_FILE))?;
        Store::open_with(dir, sealer)
    }

    /// Open the embedded store in `dir` (created if needed), Secrets sealed with
    /// `sealer`'s keys.
    pub fn open_with(dir: &Path, sealer: seal::Sealer) -> anyhow::Result<Store> {
        use anyhow::Context;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("store.redb");
        let keys = sealer.path().display().to_string();
        let kv = Kv::open(&path, sealer)
            .with_context(|| format!("opening store {} (keys from {keys})", path.display()))?;
        Ok(Store::with_backend(Backend::Embedded(kv)))
    }

    /// Open the store `[store]` names: the embedded one in `state_dir`, or etcd
    /// (connected, mirror loaded), with the key file it names (on etcd: or the
    /// cluster's keyring, see [`etcd::keyring`]).
    pub async fn from_config(
        cfg: &settings::StoreConfig,
        state_dir: &Path,
    ) -> anyhow::Result<Store> {
        match cfg.backend {
            settings::BackendKind::Embedded => {
                Store::open_with(state_dir, seal::Sealer::load(&cfg.key_file(state_dir))?)
            }
            #[cfg(feature = "etcd")]
            settings::BackendKind::Etcd => {
                // The key file, or the cluster's keyring (etcd::keyring).
                let (sealer, keyring) = etcd::keyring::sealer_for(cfg, state_dir).await?;
                let kv = etcd::EtcdKv::open_keyed(&cfg.etcd, sealer, keyring).await?;
                Ok(Store::with_backend(Backend::Etcd(kv)))
            }
            #[cfg(not(feature = "etcd"))]
            settings::BackendKind::Etcd => Err(settings::without_etcd()),
        }
    }

    /// A clone whose writes also require `fence` (a controller group's leadership;
    /// see [`etcd`]).
    #[cfg(feature = "etcd")]
    pub fn fenced(&self, fence: etcd::Fence) -> Store {
        Store::with_backend(self.kv.fenced(fence))
    }
}

impl<B: KvBackend> Store<B> {
    /// A store over `kv`, with the global registry.
    pub fn with_backend(kv: B) -> Store<B> {
        Store {
            kv,
            reg: Registry::global(),
            unique: Default::default(),
            dry: false,
        }
    }

    /// A clone whose writes are checked as they would be (schema, uniqueness, the
    /// compare-and-swap's version, the size limit) and answered with the object they
    /// would store, which is not written: kube's `dryRun=All` (`kubectl diff`,
    /// `--dry-run=server`). A dry create's object has its uid and timestamps but no
    /// resourceVersion; a dry update's keeps the stored one. Secrets are measured
    /// against the size limit unsealed (sealing adds a few dozen bytes).
    pub fn dry_run(&self) -> Store<B> {
        Store {
            dry: true,
            ..self.clone()
        }
    }

    /// Whether this is a [`Store::dry_run`] clone.
    pub fn is_dry_run(&self) -> bool {
        self.dry
    }

    /// The checks a dry write stands in for the engine's: the size limit and, with
    /// `at`, that the key is still at that revision (`Some(0)`: that it is absent).
    fn dry_check(&self, rt: &ResourceType, key: &str, v: &Value, at: Option<Rev>) -> Result<()> {
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let size = serde_json::to_vec(v).map(|t| t.len()).unwrap_or(usize::MAX);
        if size > backend::MAX_VALUE_BYTES {
            return Err(StoreError::TooLarge {
                qualified: rt.qualified(),
                name: name.into(),
                size,
                limit: backend::MAX_VALUE_BYTES,
            });
        }
        match (at, self.kv.get(key)) {
            (Some(0), Some(_)) => Err(StoreError::AlreadyExists {
                qualified: rt.qualified(),
                name: name.into(),
            }),
            (Some(rev), found) if rev != 0 && found.as_ref().is_none_or(|kv| kv.mod_rev != rev) => {
                Err(Self::conflict(rt, name))
            }
            _ => Ok(()),
        }
    }

    pub fn registry(&self) -> &'static Registry {
        self.reg
    }

    /// The backend, for what the object layer does not cover (tests, tools).
    pub fn kv(&self) -> &B {
        &self.kv
    }

    pub fn revision(&self) -> Rev {
        self.kv.revision()
    }

    /// Rewrite up to `max` Secrets and BMCSecrets stored under a key other than the
    /// key file's first (or in clear) as they are, so they are sealed with the first
    /// key: a compare-and-swap put each, through the engine's write path (on etcd the
    /// other appliances see it). A write that lost a race is left for the next pass.
    pub async fn reseal(&self, max: usize) -> Result<Resealed> {
        let sealing = self.kv.sealing();
        let primary = sealing.sealer.primary();
        let mut done = Resealed::default();
        for key in sealing.ledger.stale(&primary, max) {
            // Absent: deleted meanwhile, or (etcd) a value no key opens.
            let Some(cur) = self.kv.get(&key) else {
                done.skipped += 1;
                continue;
            };
            let op = Op::put(
                key.to_string(),
                Compare::ModRev(cur.mod_rev),
                (*cur.value()).clone(),
            );
            match self.kv.txn(vec![op]).await {
                Ok(_) => done.rewritten += 1,
                Err(KvError::Conflict { .. } | KvError::NotFound { .. }) => done.skipped += 1,
                Err(e) => return Err(map_kv(e)),
            }
        }
        Ok(done)
    }

    /// Flush and close (waits for queued writes).
    pub fn close(&self) {
        self.kv.close()
    }

    fn namespace_of<'a>(rt: &ResourceType, ns: Option<&'a str>) -> Option<&'a str> {
        if rt.namespaced {
            Some(ns.filter(|n| !n.is_empty()).unwrap_or("default"))
        } else {
            None
        }
    }

    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> Result<Arc<Value>> {
        let ns = Self::namespace_of(rt, ns);
        self.kv
            .get(&rt.key(ns, name))
            .map(|kv| kv.value())
            .ok_or_else(|| StoreError::NotFound {
                qualified: rt.qualified(),
                name: name.into(),
            })
    }

    /// An object's compact JSON text as stored (the bytes `get`'s value serializes
    /// to, field order kept), without parsing it.
    pub fn get_text(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> Result<Arc<str>> {
        let ns = Self::namespace_of(rt, ns);
        self.kv
            .get(&rt.key(ns, name))
            .map(|kv| kv.raw)
            .ok_or_else(|| StoreError::NotFound {
                qualified: rt.qualified(),
                name: name.into(),
            })
    }

    /// [`Store::list`] as the objects' stored texts (parsed only to match a selector).
    pub fn list_text(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: Option<&Selector>,
    ) -> (Vec<Arc<str>>, Rev) {
        let ns = if rt.namespaced { ns } else { None };
        let (kvs, rev) = self.kv.range(&rt.prefix(ns));
        let out = kvs
            .into_iter()
            .filter(|kv| sel.is_none_or(|s| s.matches(meta::labels(&kv.value()))))
            .map(|kv| kv.raw)
            .collect();
        (out, rev)
    }

    /// Objects of a type (all namespaces when `ns` is None), filtered by labels, parsed
    /// one at a time as the iterator advances (outside the store's read lock, which
    /// the writer waits on). A parsed object costs ~10x its text: a watcher re-listing
    /// 10,000 Servers after falling behind held them all parsed at once, a 60-90 MiB
    /// burst that the allocator then kept resident.
    pub fn list<'a>(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: Option<&'a Selector>,
    ) -> (Objects<'a>, Rev) {
        let ns = if rt.namespaced { ns } else { None };
        let (kvs, rev) = self.kv.range(&rt.prefix(ns));
        (
            Objects {
                kvs: kvs.into_iter(),
                sel,
            },
            rev,
        )
    }

    pub fn watch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        from: Rev,
    ) -> Result<ObjectWatch<B::Watch>> {
        let ns = if rt.namespaced { ns } else { None };
        Ok(ObjectWatch {
            inner: self.kv.watch(&rt.prefix(ns), from).map_err(map_kv)?,
        })
    }

    /// Create an object. Its namespace defaults to `default`.
    pub async fn create(&self, rt: &ResourceType, mut obj: Value) -> Result<Arc<Value>> {
        if obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            if let Some(prefix) = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .map(String::from)
            {
                let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..5].to_string();
                obj["metadata"]["name"] = Value::String(format!("{prefix}{suffix}"));
            }
        }
        validate::check(rt, &mut obj, None)?;
        let _held = self.check_unique(rt, &obj, None)?;
        stamp_created(&mut obj);
        let name = meta::name(&obj).to_string();
        let key = rt.key(meta::namespace(&obj), &name);
        if self.dry {
            self.dry_check(rt, &key, &obj, Some(0))?;
            return Ok(Arc::new(obj));
        }
        match self.kv.txn(vec![Op::put(key, Compare::Absent, obj)]).await {
            Ok(mut r) => Ok(r.values.pop().flatten().expect("put returns its value")),
            Err(KvError::AlreadyExists { .. }) => Err(StoreError::AlreadyExists {
                qualified: rt.qualified(),
                name,
            }),
            Err(e) => Err(map_write(rt, &name, e)),
        }
    }

    fn conflict(rt: &ResourceType, name: &str) -> StoreError {
        StoreError::Conflict {
            qualified: rt.qualified(),
            name: name.into(),
            message: "the object has been modified; please apply your changes to the latest version and try again".into(),
        }
    }

    /// Replace an object (or its status). With `metadata.resourceVersion` set this is a
    /// compare-and-swap; without, it applies to whatever is stored now.
    pub async fn update(&self, rt: &ResourceType, obj: Value, part: Part) -> Result<Arc<Value>> {
        let name = meta::name(&obj).to_string();
        let ns = Self::namespace_of(rt, meta::namespace(&obj)).map(String::from);
        let cur = self.get(rt, ns.as_deref(), &name)?;
        self.update_from(rt, cur, obj, part).await
    }

    /// [`Store::update`] when the caller holds the object it changed, as read from this
    /// store (`cur`, with `obj` naming the same object): it is not read again. A
    /// compare-and-swap against `cur`, so a `cur` that is no longer the stored version
    /// gets `Conflict`, as an `obj` with `cur`'s resourceVersion would.
    pub async fn update_from(
        &self,
        rt: &ResourceType,
        cur: Arc<Value>,
        obj: Value,
        part: Part,
    ) -> Result<Arc<Value>> {
        let (name, ns, cur_rv) = Self::same_object(rt, &cur, &obj)?;
        let mut new = match part {
            Part::Main => {
                let mut n = obj;
                if rt.status_subresource {
                    match cur.get("status") {
                        Some(s) => {
                            n.as_object_mut()
                                .map(|m| m.insert("status".into(), s.clone()));
                        }
                        None => {
                            n.as_object_mut().map(|m| m.remove("status"));
                        }
                    }
                }
                n
            }
            Part::Status => {
                let mut obj = obj;
                let mut n = with_status(&cur, obj.as_object_mut().and_then(|m| m.remove("status")));
                // Who wrote the status is recorded (the API's managedFields) with it.
                if let Some(mf) = obj.pointer_mut("/metadata/managedFields").map(Value::take) {
                    if let Some(m) = n.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("managedFields".into(), mf);
                    }
                }
                n
            }
        };
        keep_server_metadata(rt, &name, &cur, &mut new)?;
        validate::check(rt, &mut new, Some(&cur))?;
        let _held = self.check_unique(rt, &new, Some(&cur))?;
        self.commit_update(rt, ns.as_deref(), &name, cur, cur_rv, new)
            .await
    }

    /// `obj` names the object `cur` is (name and namespace), and pins no other
    /// resourceVersion than `cur`'s: its name, namespace and `cur`'s revision.
    fn same_object(
        rt: &ResourceType,
        cur: &Value,
        obj: &Value,
    ) -> Result<(String, Option<String>, Rev)> {
        let name = meta::name(obj).to_string();
        let ns = Self::namespace_of(rt, meta::namespace(obj)).map(String::from);
        if meta::name(cur) != name || Self::namespace_of(rt, meta::namespace(cur)) != ns.as_deref()
        {
            return Err(StoreError::BadRequest(format!(
                "update of {name:?} from another object ({:?})",
                meta::name(cur)
            )));
        }
        let cur_rv = meta::resource_version(cur).unwrap_or(0);
        if meta::resource_version(obj).is_some_and(|rv| rv != cur_rv) {
            return Err(Self::conflict(rt, &name));
        }
        Ok((name, ns, cur_rv))
    }

    /// Replace the status of `cur`, an object as read from this store, with `status`:
    /// the same as [`Store::update`] with `Part::Status` and `cur`'s resourceVersion,
    /// without reading the object again or copying it twice (the status writes of the
    /// controllers). A compare-and-swap against `cur`: `Conflict` when it is no longer
    /// the stored version.
    pub async fn update_status(
        &self,
        rt: &ResourceType,
        cur: &Arc<Value>,
        status: Value,
    ) -> Result<Arc<Value>> {
        let name = meta::name(cur).to_string();
        let ns = Self::namespace_of(rt, meta::namespace(cur)).map(String::from);
        let cur_rv = meta::resource_version(cur).unwrap_or(0);
        let mut new = with_status(cur, Some(status));
        if !new.get("metadata").is_some_and(Value::is_object) {
            return Err(err_invalid(
                rt,
                &name,
                vec![field("metadata", Reason::Required, "Required value")],
            ));
        }
        validate::check(rt, &mut new, Some(cur))?;
        let _held = self.check_unique(rt, &new, Some(cur))?;
        self.commit_update(rt, ns.as_deref(), &name, cur.clone(), cur_rv, new)
            .await
    }

    /// The end of an update: `new` (checked) replaces `cur` at `cur_rv` unless equal.
    async fn commit_update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        cur: Arc<Value>,
        cur_rv: Rev,
        mut new: Value,
    ) -> Result<Arc<Value>> {
        if !next_version(&cur, cur_rv, &mut new) {
            return Ok(cur);
        }
        let key = rt.key(ns, name);
        if self.dry {
            self.dry_check(rt, &key, &new, Some(cur_rv))?;
            return Ok(Arc::new(new));
        }
        if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() {
            self.remove(rt, &cur, name).await?;
            return Ok(Arc::new(new));
        }
        match self
            .kv
            .txn(vec![Op::put(key, Compare::ModRev(cur_rv), new)])
            .await
        {
            Ok(mut r) => Ok(r.values.pop().flatten().expect("put")),
            Err(KvError::Conflict { .. } | KvError::NotFound { .. }) => {
                Err(Self::conflict(rt, name))
            }
            Err(e) => Err(map_write(rt, name, e)),
        }
    }

    /// JSON merge patch (RFC 7386). Retries on conflict unless the patch pins a
    /// resourceVersion.
    pub async fn patch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        part: Part,
    ) -> Result<Arc<Value>> {
        if !patch.is_object() {
            return Err(StoreError::BadRequest(
                "merge patch must be a JSON object".into(),
            ));
        }
        let pinned = patch.pointer("/metadata/resourceVersion").is_some();
        // A pinned patch is one compare-and-swap; else the patch is applied again to
        // whatever is stored after a conflict.
        let attempt = || {
            let obj = self.get(rt, ns, name).map(|cur| {
                let mut obj = (*cur).clone();
                merge_patch(&mut obj, patch);
                if !pinned {
                    obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                }
                obj["metadata"]["name"] = Value::String(name.into());
                obj
            });
            async move { self.update(rt, obj?, part).await }
        };
        if pinned {
            return attempt().await;
        }
        retry_on_conflict(16, attempt).await
    }

    /// Delete an object. With finalizers it is only marked (`deletionTimestamp`) and
    /// returned; without, it is removed along with its dependents (cascading).
    /// Returns the object as it was, marked or removed.
    pub async fn delete(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Rev>,
    ) -> Result<Arc<Value>> {
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            let rv = meta::resource_version(&cur).unwrap_or(0);
            if precondition.is_some_and(|p| p != rv) {
                return Err(Self::conflict(rt, name));
            }
            if !meta::finalizers(&cur).is_empty() {
                if meta::is_deleting(&cur) {
                    return Ok(cur);
                }
                let mut marked = (*cur).clone();
                marked["metadata"]["deletionTimestamp"] = Value::String(now());
                marked["metadata"]["deletionGracePeriodSeconds"] = Value::from(0);
                if self.dry {
                    return Ok(Arc::new(marked));
                }
                let key = rt.key(Self::namespace_of(rt, ns), name);
                match self
                    .kv
                    .txn(vec![Op::put(key, Compare::ModRev(rv), marked)])
                    .await
                {
                    Ok(mut r) => return Ok(r.values.pop().flatten().expect("put")),
                    Err(KvError::Conflict { .. }) => continue,
                    Err(KvError::NotFound { .. }) => {
                        return Err(StoreError::NotFound {
                            qualified: rt.qualified(),
                            name: name.into(),
                        })
                    }
                    Err(e) => return Err(map_kv(e)),
                }
            }
            if self.dry {
                return Ok(cur);
            }
            match self.remove(rt, &cur, name).await {
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
                Ok(()) => return Ok(cur),
            }
        }
        Err(Self::conflict(rt, name))
    }

    /// Remove `cur` and, in the same transaction, its dependents: those whose every
    /// owner is being removed. Dependents with finalizers are marked instead.
    async fn remove(&self, rt: &ResourceType, cur: &Value, name: &str) -> Result<()> {
        let key = rt.key(meta::namespace(cur), name);
        let rv = meta::resource_version(cur).unwrap_or(0);
        let mut ops = vec![Op::delete(key.clone(), Compare::ModRev(rv))];
        let mut gone: HashSet<String> = HashSet::from([meta::uid(cur).to_string()]);
        let mut seen: HashSet<String> = HashSet::from([key]);
        // Fixed point: objects whose owners are all gone go too.
        loop {
            // A dependent's text names its owner's uid (in ownerReferences), so only
            // objects whose text contains a removed uid are parsed.
            let mut found = Vec::new();
            self.kv.scan("/", |kv| {
                if !seen.contains(&*kv.key) && gone.iter().any(|u| kv.raw.contains(u.as_str())) {
                    found.push(kv.clone());
                }
            });
            let found: Vec<(kv::KeyValue, Arc<Value>)> = found
                .into_iter()
                .map(|kv| {
                    let v = kv.value();
                    (kv, v)
                })
                .filter(|(_, v)| meta::owner_uids(v).iter().any(|u| gone.contains(*u)))
                .collect();
            // Owners that are not being removed count as gone when they do not exist.
            let others: HashSet<String> = found
                .iter()
                .flat_map(|(_, v)| meta::owner_uids(v))
                .filter(|u| !gone.contains(*u))
                .map(String::from)
                .collect();
            let existing = self.existing_uids(&others);
            let mut progressed = false;
            for (d, v) in found {
                let owners = meta::owner_uids(&v);
                let all_gone = owners
                    .iter()
                    .all(|u| gone.contains(*u) || !existing.contains(*u));
                if !all_gone {
                    continue;
                }
                seen.insert(d.key.to_string());
                progressed = true;
                if meta::finalizers(&v).is_empty() {
                    gone.insert(meta::uid(&v).to_string());
                    ops.push(Op::delete(d.key.to_string(), Compare::ModRev(d.mod_rev)));
                } else if !meta::is_deleting(&v) {
                    let mut marked = (*v).clone();
                    marked["metadata"]["deletionTimestamp"] = Value::String(now());
                    ops.push(Op::put(
                        d.key.to_string(),
                        Compare::ModRev(d.mod_rev),
                        marked,
                    ));
                }
            }
            if !progressed {
                break;
            }
        }
        match self.kv.txn(ops).await {
            Ok(_) => Ok(()),
            Err(KvError::Conflict { .. } | KvError::NotFound { .. }) => {
                Err(Self::conflict(rt, name))
            }
            Err(e) => Err(map_kv(e)),
        }
    }

    /// Which of `uids` belong to a stored object (only objects whose text contains
    /// one of them are parsed).
    fn existing_uids(&self, uids: &HashSet<String>) -> HashSet<String> {
        if uids.is_empty() {
            return HashSet::new();
        }
        let mut found = Vec::new();
        self.kv.scan("/", |kv| {
            if uids.iter().any(|u| kv.raw.contains(u.as_str())) {
                found.push(kv.clone());
            }
        });
        found
            .iter()
            .map(|kv| meta::uid(&kv.value()).to_string())
            .filter(|u| uids.contains(u))
            .collect()
    }
}

/// `new`, replacing `cur`, keeps the metadata the server owns (uid, creation, deletion,
/// generation) from `cur`; `new` without a `metadata` object is invalid.
fn keep_server_metadata(rt: &ResourceType, name: &str, cur: &Value, new: &mut Value) -> Result<()> {
    let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(err_invalid(
            rt,
            name,
            vec![field("metadata", Reason::Required, "Required value")],
        ));
    };
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match cur["metadata"].get(f) {
            Some(v) => m.insert(f.into(), v.clone()),
            None => m.remove(f),
        };
    }
    Ok(())
}

/// `new` (checked) as the version after `cur` (at `cur_rv`): its resourceVersion
/// `cur`'s, its generation one up when the spec changed. `false` when it is `cur`
/// unchanged (nothing to write).
fn next_version(cur: &Value, cur_rv: Rev, new: &mut Value) -> bool {
    new["metadata"]["resourceVersion"] = Value::String(cur_rv.to_string());
    if *new == *cur {
        return false;
    }
    if spec_changed(cur, new) {
        let g = cur
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        new["metadata"]["generation"] = Value::from(g + 1);
    }
    true
}

/// The server-owned metadata of a new object (checked: `metadata` is an object).
fn stamp_created(obj: &mut Value) {
    let m = obj["metadata"].as_object_mut().expect("checked");
    m.insert(
        "uid".into(),
        Value::String(uuid::Uuid::new_v4().to_string()),
    );
    m.insert("creationTimestamp".into(), Value::String(now()));
    m.insert("generation".into(), Value::from(1));
    m.remove("resourceVersion");
    m.remove("deletionTimestamp");
    m.remove("deletionGracePeriodSeconds");
}

fn spec_changed(a: &Value, b: &Value) -> bool {
    // Everything but metadata and status counts as spec (compared without copying).
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a != b;
    };
    let skip = |k: &String| k == "metadata" || k == "status";
    let ka = a.keys().filter(|k| !skip(k)).count();
    let kb = b.keys().filter(|k| !skip(k)).count();
    ka != kb
        || a.iter()
            .filter(|(k, _)| !skip(k))
            .any(|(k, v)| b.get(k) != Some(v))
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Base64-decoded value of one key of a Secret's `data`.
pub fn secret_data(secret: &Value, key: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let s = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// `cur` with its status replaced by `status` (removed when `None`): every other
/// field copied once, in order, and a status `cur` lacked appended, as
/// `Map::insert` would (what status writes of both kinds produce).
fn with_status(cur: &Value, status: Option<Value>) -> Value {
    let Value::Object(fields) = cur else {
        return cur.clone();
    };
    let mut status = status;
    let mut m = Map::new();
    for (k, v) in fields {
        if k == "status" {
            if let Some(s) = status.take() {
                m.insert(k.clone(), s);
            }
        } else {
            m.insert(k.clone(), v.clone());
        }
    }
    if let Some(s) = status {
        m.insert("status".into(), s);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests;
