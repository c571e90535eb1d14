//! The object store: Kubernetes object semantics on top of the revisioned KV
//! ([`kv`], etcd semantics). This is where `metadata` is owned: `uid`,
//! `creationTimestamp`, `generation`, `resourceVersion` (= the KV `mod_rev`),
//! finalizers and `deletionTimestamp`, and cascading deletion of dependents named
//! by `ownerReferences`. Every write is validated against the type's schema first.
//!
//! Controllers and the REST API both go through [`Store`]; nothing else writes the KV.
//!
//! Objects come back as `Arc<serde_json::Value>`, parsed from the KV's JSON text on
//! each read (shared with the writer for the last writes, see [`kv`]); callers that
//! keep objects for long should keep only the fields they need. Callers that only
//! pass objects on as JSON take the stored text ([`Store::get_text`],
//! [`Store::list_text`], [`ObjectEvent::text`]); writers that hold the object they
//! read update against it ([`Store::update_status`], [`Store::update_from`]).

pub mod kv;
pub mod watcher;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::model::labels;
use crate::model::meta;
use crate::model::registry::{Registry, ResourceType};
use crate::model::schema::{FieldError, Reason};
use crate::model::selector::Selector;
use kv::{Compare, EventKind, Kv, KvError, Op, Rev};

/// Errors callers branch on; each maps to one HTTP status (see `api::status`).
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
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

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

pub struct ObjectWatch {
    inner: kv::Watch,
}

impl ObjectWatch {
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

/// The current time as the RFC 3339 string (seconds, `Z`) used in metadata and status.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The object store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    kv: Kv,
    reg: &'static Registry,
}

fn err_invalid(rt: &ResourceType, name: &str, causes: Vec<FieldError>) -> StoreError {
    StoreError::Invalid {
        kind: rt.kind.clone(),
        name: name.to_string(),
        causes,
    }
}

fn field(f: &str, reason: Reason, message: impl Into<String>) -> FieldError {
    FieldError {
        field: f.into(),
        reason,
        message: message.into(),
    }
}

/// RFC 1123 subdomain, as kube requires for most object names.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.as_bytes()[n.len() - 1].is_ascii_alphanumeric()
}

impl Store {
    /// Open the store in `dir` (created if needed).
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        use anyhow::Context;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("store.redb");
        let kv = Kv::open(&path).with_context(|| format!("opening store {}", path.display()))?;
        Ok(Store {
            kv,
            reg: Registry::global(),
        })
    }

    pub fn registry(&self) -> &'static Registry {
        self.reg
    }

    pub fn kv(&self) -> &Kv {
        &self.kv
    }

    pub fn revision(&self) -> Rev {
        self.kv.revision()
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
        let (kvs, rev) = self.kv.list(&rt.prefix(ns));
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
        let (kvs, rev) = self.kv.list(&rt.prefix(ns));
        (
            Objects {
                kvs: kvs.into_iter(),
                sel,
            },
            rev,
        )
    }

    pub fn watch(&self, rt: &ResourceType, ns: Option<&str>, from: Rev) -> Result<ObjectWatch> {
        let ns = if rt.namespaced { ns } else { None };
        Ok(ObjectWatch {
            inner: self.kv.watch(&rt.prefix(ns), from).map_err(map_kv)?,
        })
    }

    /// Normalise and validate an object for `rt`; `old` is the stored object on update.
    fn check(&self, rt: &ResourceType, obj: &mut Value, old: Option<&Value>) -> Result<()> {
        let Value::Object(map) = obj else {
            return Err(StoreError::BadRequest(
                "object must be a JSON/YAML mapping".into(),
            ));
        };
        let name = map
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match map.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v == rt.api_version() => {}
            Some(v) => {
                return Err(StoreError::BadRequest(format!(
                    "apiVersion {v:?} does not match {} for kind {}",
                    rt.api_version(),
                    rt.kind
                )))
            }
            None => {
                map.insert("apiVersion".into(), Value::String(rt.api_version()));
            }
        }
        match map.get("kind").and_then(Value::as_str) {
            Some(k) if k == rt.kind => {}
            Some(k) => {
                return Err(StoreError::BadRequest(format!(
                    "kind {k:?} does not match {}",
                    rt.kind
                )))
            }
            None => {
                map.insert("kind".into(), Value::String(rt.kind.clone()));
            }
        }
        let mut causes = Vec::new();
        match map.get_mut("metadata") {
            Some(Value::Object(m)) => {
                if !valid_name(&name) {
                    causes.push(field(
                        "metadata.name",
                        if name.is_empty() { Reason::Required } else { Reason::Invalid },
                        if name.is_empty() {
                            "Required value: name is required".to_string()
                        } else {
                            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
                        },
                    ));
                }
                if rt.namespaced {
                    let ns = m
                        .get("namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("default")
                        .to_string();
                    if !valid_name(&ns) {
                        causes.push(field(
                            "metadata.namespace",
                            Reason::Invalid,
                            format!("Invalid value: {ns:?}"),
                        ));
                    }
                    m.insert("namespace".into(), Value::String(ns));
                } else {
                    m.remove("namespace");
                }
                for f in ["labels", "annotations"] {
                    match m.get(f) {
                        None | Some(Value::Null) => {}
                        Some(Value::Object(l)) => {
                            for (k, v) in l {
                                if !v.is_string() {
                                    causes.push(field(
                                        &format!("metadata.{f}.{k}"),
                                        Reason::TypeInvalid,
                                        "must be a string",
                                    ));
                                }
                            }
                            // Syntax and size (Kubernetes' rules). Unchanged on an
                            // update, they are not checked again: an object stored
                            // before these rules keeps taking status writes.
                            let old_l = old.and_then(|o| o.pointer(&format!("/metadata/{f}")));
                            if old_l.and_then(Value::as_object) != Some(l) {
                                if f == "labels" {
                                    labels::check_labels(l, &mut causes);
                                } else {
                                    labels::check_annotations(l, &mut causes);
                                }
                            }
                        }
                        Some(_) => causes.push(field(
                            &format!("metadata.{f}"),
                            Reason::TypeInvalid,
                            "must be a map of strings",
                        )),
                    }
                }
            }
            _ => causes.push(field("metadata", Reason::Required, "Required value")),
        }
        if rt.kind == "Secret" && rt.group.is_empty() {
            check_secret(map, &mut causes);
        }
        if let Some(schema) = &rt.schema {
            schema.apply_defaults(obj);
            schema.validate("", obj, old, &mut causes);
        }
        // Stricter than the CRD (which has no enum here): the controllers can only act
        // on On and Off, so anything else is refused up front.
        if rt.group == "metal.ironcore.dev" && (rt.kind == "Server" || rt.kind == "ServerClaim") {
            if let Some(p) = obj.pointer("/spec/power").filter(|p| !p.is_null()) {
                if p != "On" && p != "Off" {
                    causes.push(field(
                        "spec.power",
                        Reason::NotSupported,
                        format!("Unsupported value: {p}: supported values: \"On\", \"Off\""),
                    ));
                }
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(err_invalid(rt, &name, causes))
        }
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
        self.check(rt, &mut obj, None)?;
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
        let name = meta::name(&obj).to_string();
        let key = rt.key(meta::namespace(&obj), &name);
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
        let name = meta::name(&obj).to_string();
        let ns = Self::namespace_of(rt, meta::namespace(&obj)).map(String::from);
        if meta::name(&cur) != name
            || Self::namespace_of(rt, meta::namespace(&cur)) != ns.as_deref()
        {
            return Err(StoreError::BadRequest(format!(
                "update of {name:?} from another object ({:?})",
                meta::name(&cur)
            )));
        }
        let cur_rv = meta::resource_version(&cur).unwrap_or(0);
        if let Some(rv) = meta::resource_version(&obj) {
            if rv != cur_rv {
                return Err(Self::conflict(rt, &name));
            }
        }
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
                with_status(&cur, obj.as_object_mut().and_then(|m| m.remove("status")))
            }
        };
        // Server-owned metadata is kept from the stored object.
        if !new.get("metadata").is_some_and(Value::is_object) {
            return Err(err_invalid(
                rt,
                &name,
                vec![field("metadata", Reason::Required, "Required value")],
            ));
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            let m = new["metadata"].as_object_mut().expect("object");
            match cur["metadata"].get(f) {
                Some(v) => {
                    m.insert(f.into(), v.clone());
                }
                None => {
                    m.remove(f);
                }
            }
        }
        self.check(rt, &mut new, Some(&cur))?;
        self.commit_update(rt, ns.as_deref(), &name, cur, cur_rv, new)
            .await
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
        self.check(rt, &mut new, Some(cur))?;
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
        new["metadata"]["resourceVersion"] = Value::String(cur_rv.to_string());
        if new == *cur {
            return Ok(cur);
        }
        if spec_changed(&cur, &new) {
            let g = cur
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            new["metadata"]["generation"] = Value::from(g + 1);
        }
        let key = rt.key(ns, name);
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
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            let mut obj = (*cur).clone();
            merge_patch(&mut obj, patch);
            if !pinned {
                obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
            }
            obj["metadata"]["name"] = Value::String(name.into());
            match self.update(rt, obj, part).await {
                Err(StoreError::Conflict { .. }) if !pinned => continue,
                other => return other,
            }
        }
        Err(Self::conflict(rt, name))
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

fn check_secret(map: &mut Map<String, Value>, causes: &mut Vec<FieldError>) {
    use base64::Engine;
    const ALLOWED: &[&str] = &[
        "apiVersion",
        "kind",
        "metadata",
        "data",
        "stringData",
        "type",
        "immutable",
    ];
    for k in map.keys() {
        if !ALLOWED.contains(&k.as_str()) {
            causes.push(field(k, Reason::Unknown, format!("unknown field \"{k}\"")));
        }
    }
    if let Some(Value::Object(sd)) = map.remove("stringData") {
        let data = map
            .entry("data")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(d) = data {
            for (k, v) in sd {
                match v {
                    Value::String(s) => {
                        d.insert(
                            k,
                            Value::String(base64::engine::general_purpose::STANDARD.encode(s)),
                        );
                    }
                    _ => causes.push(field(
                        &format!("stringData.{k}"),
                        Reason::TypeInvalid,
                        "must be a string",
                    )),
                }
            }
        }
    }
    match map.get("data") {
        None | Some(Value::Null) => {}
        Some(Value::Object(d)) => {
            for (k, v) in d {
                match v.as_str() {
                    Some(s) => {
                        if let Err(e) = base64::engine::general_purpose::STANDARD.decode(s) {
                            causes.push(field(
                                &format!("data.{k}"),
                                Reason::Invalid,
                                format!("illegal base64 data: {e}"),
                            ));
                        }
                    }
                    None => causes.push(field(
                        &format!("data.{k}"),
                        Reason::TypeInvalid,
                        "must be a base64 string",
                    )),
                }
                if k.is_empty()
                    || !k
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
                {
                    causes.push(field(&format!("data.{k}"), Reason::Invalid, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"));
                }
            }
        }
        Some(_) => causes.push(field(
            "data",
            Reason::TypeInvalid,
            "must be a map of base64 strings",
        )),
    }
    if !map.contains_key("type") {
        map.insert("type".into(), Value::String("Opaque".into()));
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
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        (d, s)
    }

    fn rt(name: &str) -> Arc<ResourceType> {
        Registry::global().resolve(name).unwrap()
    }

    #[tokio::test]
    async fn create_sets_metadata_and_update_is_cas() {
        let (_d, s) = store();
        let srv = rt("server");
        let o = s
            .create(
                &srv,
                json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "u1"}}),
            )
            .await
            .unwrap();
        assert_eq!(o["apiVersion"], "metal.ironcore.dev/v1alpha1");
        assert_eq!(o["metadata"]["generation"], 1);
        assert_eq!(o["spec"]["reclaimPolicy"], "Recycle", "default applied");
        assert!(o["metadata"]["uid"].as_str().unwrap().len() > 10);
        let mut stale = (*o).clone();
        let mut upd = (*o).clone();
        upd["spec"]["power"] = json!("On");
        let o2 = s.update(&srv, upd, Part::Main).await.unwrap();
        assert_eq!(o2["metadata"]["generation"], 2);
        stale["spec"]["power"] = json!("Off");
        let err = s.update(&srv, stale, Part::Main).await.unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        // Status through the main endpoint is ignored; through Status it lands.
        let mut st = (*o2).clone();
        st["status"] = json!({"state": "Available"});
        let o3 = s.update(&srv, st.clone(), Part::Main).await.unwrap();
        assert!(o3.get("status").is_none());
        let o4 = s.update(&srv, st, Part::Status).await.unwrap();
        assert_eq!(o4["status"]["state"], "Available");
        assert_eq!(
            o4["metadata"]["generation"], 2,
            "status does not bump generation"
        );
    }

    #[tokio::test]
    async fn finalizers_and_cascade() {
        let (_d, s) = store();
        let claim = rt("serverclaim");
        let sbc = rt("sbc");
        let c = s
            .create(&claim, json!({"metadata": {"name": "c", "finalizers": ["x/f"]}, "spec": {"image": "i", "power": "On"}}))
            .await
            .unwrap();
        let owner = json!([{"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim", "name": "c", "uid": c["metadata"]["uid"]}]);
        s.create(&sbc, json!({"metadata": {"name": "c", "ownerReferences": owner}, "spec": {"serverRef": {"name": "s"}}}))
            .await
            .unwrap();
        let marked = s.delete(&claim, None, "c", None).await.unwrap();
        assert!(meta::is_deleting(&marked));
        assert!(
            s.get(&sbc, None, "c").is_ok(),
            "dependent stays while owner is only marked"
        );
        let mut f = (*s.get(&claim, None, "c").unwrap()).clone();
        f["metadata"]["finalizers"] = json!([]);
        s.update(&claim, f, Part::Main).await.unwrap();
        assert!(matches!(
            s.get(&claim, None, "c"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(
            matches!(s.get(&sbc, None, "c"), Err(StoreError::NotFound { .. })),
            "cascaded"
        );
    }

    #[tokio::test]
    async fn validation_names_problems_and_stores_nothing() {
        let (_d, s) = store();
        let claim = rt("serverclaim");
        let err = s
            .create(
                &claim,
                json!({"metadata": {"name": "c"}, "spec": {"power": "Sideways", "bogus": 1}}),
            )
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("spec.image: Required value"), "{msg}");
        assert!(msg.contains("spec.power"), "{msg}");
        assert!(msg.contains("unknown field \"spec.bogus\""), "{msg}");
        assert_eq!(s.revision(), 0);
        let c = s
            .create(&claim, json!({"metadata": {"name": "c"}, "spec": {"image": "i", "power": "On", "serverRef": {"name": "a"}}}))
            .await
            .unwrap();
        let mut u = (*c).clone();
        u["spec"]["serverRef"]["name"] = json!("b");
        let err = s.update(&claim, u, Part::Main).await.unwrap_err();
        assert!(err.to_string().contains("serverRef is immutable"), "{err}");
        let secret = rt("secret");
        let err = s
            .create(
                &secret,
                json!({"metadata": {"name": "x"}, "data": {"k": "not base64!"}}),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("data.k: illegal base64"), "{err}");
    }

    #[tokio::test]
    async fn update_status_matches_update_of_the_status_part() {
        let (_d, s) = store();
        let srv = rt("server");
        let body = json!({"metadata": {"name": "a", "labels": {"z": "1", "a": "2"}},
            "spec": {"systemUUID": "u1"}, "status": {"state": "Available", "powerState": "Off"}});
        let a = s.create(&srv, body.clone()).await.unwrap();
        let mut b_body = body.clone();
        b_body["metadata"]["name"] = json!("b");
        let b = s.create(&srv, b_body).await.unwrap();
        let status = json!({"state": "Reserved", "powerState": "Off", "conditions": []});
        let mut o = (*a).clone();
        o["status"] = status.clone();
        let via_update = s.update(&srv, o, Part::Status).await.unwrap();
        let via_status = s.update_status(&srv, &b, status.clone()).await.unwrap();
        // Same object but for the server-owned identity fields, same field order.
        let strip = |v: &Value| {
            let mut v = v.clone();
            for f in ["name", "uid", "resourceVersion", "creationTimestamp"] {
                v["metadata"].as_object_mut().unwrap().remove(f);
            }
            v.to_string()
        };
        assert_eq!(strip(&via_update), strip(&via_status));
        assert_eq!(via_status["status"], status);
        assert_eq!(
            via_status["metadata"]["generation"], 1,
            "status is not spec"
        );
        // Unchanged: nothing written. Stale: conflict, nothing written.
        let rev = s.revision();
        let same = s
            .update_status(&srv, &via_status, status.clone())
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&same, &via_status));
        assert_eq!(s.revision(), rev);
        let err = s
            .update_status(&srv, &b, json!({"state": "Error"}))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        assert_eq!(s.get(&srv, None, "b").unwrap(), via_status);
        // An object without status gets one (appended, as update does).
        let mut c_body = body.clone();
        c_body["metadata"]["name"] = json!("c");
        c_body.as_object_mut().unwrap().remove("status");
        let c = s.create(&srv, c_body).await.unwrap();
        let c2 = s
            .update_status(&srv, &c, json!({"state": "Available"}))
            .await
            .unwrap();
        let keys: Vec<&String> = c2.as_object().unwrap().keys().collect();
        assert_eq!(keys.last().unwrap().as_str(), "status");
        // Still validated.
        let err = s
            .update_status(&srv, &c2, json!({"state": 5}))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    }

    #[tokio::test]
    async fn texts_are_the_bytes_of_the_parsed_objects() {
        let (_d, s) = store();
        let claim = rt("serverclaim");
        for (i, n) in ["b", "a", "c"].iter().enumerate() {
            let o = json!({"metadata": {"name": n, "labels": {"i": i.to_string(), "z": "v"},
                "annotations": {"x": "é\"\n"}},
                "spec": {"power": "On", "serverSelector": {"matchLabels": {"k": "v"}}, "image": "i:1"}});
            s.create(&claim, o).await.unwrap();
        }
        let t = s.get_text(&claim, Some("default"), "a").unwrap();
        let v = s.get(&claim, Some("default"), "a").unwrap();
        assert_eq!(&*t, serde_json::to_string(&*v).unwrap());
        assert!(
            t.starts_with(r#"{"metadata":{"name":"a","labels":{"i":"1","#),
            "{t}"
        );
        let (texts, rev) = s.list_text(&claim, Some("default"), None);
        let (objs, rev2) = s.list(&claim, Some("default"), None);
        assert_eq!(rev, rev2);
        let texts: Vec<&str> = texts.iter().map(|t| &**t).collect();
        let objs: Vec<String> = objs.map(|o| o.to_string()).collect();
        assert_eq!(texts, objs);
        let sel = Selector::parse("i=2").unwrap();
        let (texts, _) = s.list_text(&claim, None, Some(&sel));
        assert_eq!(texts.len(), 1);
        assert!(texts[0].contains(r#""name":"c""#));
        // Watch events carry the same text; a deletion's text is not offered (its
        // object carries the deleting revision).
        let mut w = s.watch(&claim, None, 0).unwrap();
        for _ in 0..3 {
            let e = w.next().await.unwrap();
            assert_eq!(&**e.text.as_ref().unwrap(), e.object.to_string());
        }
        s.delete(&claim, Some("default"), "a", None).await.unwrap();
        let e = w.next().await.unwrap();
        assert_eq!((e.kind, e.text.is_none()), ("DELETED", true));
        assert_eq!(e.object["metadata"]["resourceVersion"], e.rev.to_string());
        assert!(matches!(
            s.get_text(&claim, Some("default"), "a"),
            Err(StoreError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn object_limits_hold_on_every_write_path_and_store_nothing() {
        let (_d, s) = store();
        let srv = rt("server");
        let bad = json!({"metadata": {"name": "a", "labels": {"../../x y": "v"}}, "spec": {"systemUUID": "u"}});
        let err = s.create(&srv, bad).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Invalid { causes, .. } if causes[0].field == "metadata.labels"),
            "{err}"
        );
        let o = s
            .create(
                &srv,
                json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "u"}}),
            )
            .await
            .unwrap();
        let rev = s.revision();
        // Update, patch: bad label value, too many annotation bytes.
        let mut u = (*o).clone();
        u["metadata"]["labels"] = json!({"k": "a\nb"});
        let err = s.update(&srv, u, Part::Main).await.unwrap_err();
        assert!(err.to_string().contains("metadata.labels.k"), "{err}");
        let big = json!({"metadata": {"annotations": {"n": "x".repeat(300 << 10)}}});
        let err = s
            .patch(&srv, None, "a", &big, Part::Main)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("262144"), "{err}");
        // An object over 1.5 MiB in total, created or updated (the limit is checked
        // where every write's text is made, status writes included).
        let secret = rt("secret");
        let big =
            |n: &str| json!({"metadata": {"name": n}, "stringData": {"k": "x".repeat(1200 << 10)}});
        let err = s.create(&secret, big("big")).await.unwrap_err();
        assert!(
            matches!(err, StoreError::TooLarge { size, limit: kv::MAX_VALUE_BYTES, .. } if size > 1600 << 10),
            "{err}"
        );
        assert!(err.to_string().contains("secrets \"big\""), "{err}");
        assert_eq!(s.revision(), rev, "nothing was stored");
        let small = s
            .create(&secret, json!({"metadata": {"name": "small"}}))
            .await
            .unwrap();
        let rev = s.revision();
        let err = s
            .update_from(&secret, small, big("small"), Part::Main)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        assert_eq!(s.revision(), rev, "nothing was stored");
        // A watch may start at the current revision, not after it.
        assert!(s.watch(&srv, None, rev).is_ok());
        match s.watch(&srv, None, rev + 1) {
            Err(e @ StoreError::TooLargeResourceVersion { .. }) => {
                assert_eq!(
                    e.to_string(),
                    format!("Too large resource version: {}, current: {rev}", rev + 1)
                )
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a watch from the future"),
        }
    }

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }
}
