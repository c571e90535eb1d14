//! Events: core/v1-shaped `Event` objects saying what happened to an object and why
//! (a claim waiting for a server, a power change applied, a script served), written by
//! the controllers and the boot side, read with `bootplane get events --for KIND/NAME`
//! and `bootplane describe`.
//!
//! A [`Recorder`] never blocks its caller: events go into a bounded queue (full: the
//! event is dropped and counted in `bootplane_events_dropped_total`) and one task per
//! recorder writes them, the new Events waiting (up to [`BATCH`]) in one transaction
//! ([`Store::write_all`]: one revision on etcd however many reconciles recorded them). The same (object, type, reason, message) again within
//! [`AGGREGATE_WINDOW`] bumps `count` and `lastTimestamp` of the Event already written
//! instead of writing a new one (Kubernetes' aggregation), at most one write per
//! Event per [`FLUSH_EVERY`]. [`collect`] keeps the store's Events bounded: older than
//! `[events] ttl_secs` go, and beyond `[events] max_events` the oldest go.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{now, Part, Store, StoreError, Write};
use bootplane_model::meta;
use bootplane_model::registry::ResourceType;

/// The same event again within this window is counted on the Event already written.
pub(crate) const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// An aggregated Event is rewritten at most this often.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Events waiting for the writer, per recorder.
pub(crate) const QUEUE: usize = 1024;
/// New Events written in one transaction at most.
pub(crate) const BATCH: usize = 128;
/// Distinct events a recorder aggregates at once (the oldest are forgotten first).
pub(crate) const MAX_TRACKED: usize = 4096;
/// Longest `message` kept (longer ones are cut, as Kubernetes cuts at 1 KiB).
pub(crate) const MAX_MESSAGE: usize = 1024;
/// Longest `reason`.
pub(crate) const MAX_REASON: usize = 128;

/// The `[events]` config section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventSettings {
    /// Events whose last occurrence is older than this are deleted.
    pub ttl_secs: u64,
    /// At most this many Events are kept; the oldest go first.
    pub max_events: usize,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            ttl_secs: 3600,
            max_events: 20_000,
        }
    }
}

impl EventSettings {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.ttl_secs < 60 {
            anyhow::bail!(
                "events.ttl_secs must be at least 60 (got {})",
                self.ttl_secs
            );
        }
        if !(100..=1_000_000).contains(&self.max_events) {
            anyhow::bail!(
                "events.max_events must be between 100 and 1000000 (got {})",
                self.max_events
            );
        }
        Ok(())
    }
}

/// `Normal` or `Warning`, as core/v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub uid: String,
}

impl ObjectRef {
    pub(crate) fn of(rt: &ResourceType, obj: &Value) -> ObjectRef {
        ObjectRef {
            api_version: rt.api_version(),
            kind: rt.kind.clone(),
            name: meta::name(obj).to_string(),
            namespace: if rt.namespaced {
                meta::namespace(obj).unwrap_or("default").to_string()
            } else {
                String::new()
            },
            uid: meta::uid(obj).to_string(),
        }
    }

    /// The namespace its Events live in (`default` for cluster-scoped objects).
    fn event_namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
        });
        if !self.namespace.is_empty() {
            v["namespace"] = json!(self.namespace);
        }
        if !self.uid.is_empty() {
            v["uid"] = json!(self.uid);
        }
        v
    }
}

struct Pending {
    object: ObjectRef,
    ty: EventType,
    reason: String,
    message: String,
}

/// Hands events to its writer task; cheap to clone. Dropping every clone ends the task
/// once it has written what was queued.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Pending>,
    dropped: Arc<AtomicU64>,
}

/// `bootplane_events_written_total` and `bootplane_events_dropped_total` (every
/// recorder of the process).
struct Metrics {
    written: prometheus_client::metrics::counter::Counter,
    dropped: prometheus_client::metrics::counter::Counter,
}

fn metrics() -> &'static Metrics {
    static M: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    M.get_or_init(|| Metrics {
        written: Default::default(),
        dropped: Default::default(),
    })
}

/// Put the events counters on `/metrics`.
pub fn register_metrics(r: &mut prometheus_client::registry::Registry) {
    let m = metrics();
    r.register(
        "bootplane_events_written",
        "Event writes (new Events and count updates)",
        m.written.clone(),
    );
    r.register(
        "bootplane_events_dropped",
        "Events dropped because a recorder's queue was full",
        m.dropped.clone(),
    );
}

impl Recorder {
    /// A recorder writing to `store` as `component` (`source.component`,
    /// `reportingComponent`); its task runs on the current tokio runtime.
    pub fn spawn(store: Store, component: &'static str) -> Recorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(write_loop(store, component, rx));
        Recorder { tx, dropped }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn normal(&self, rt: &ResourceType, obj: &Value, reason: &str, message: impl Into<String>) {
        self.record(
            ObjectRef::of(rt, obj),
            EventType::Normal,
            reason,
            message.into(),
        );
    }

    pub fn warning(
        &self,
        rt: &ResourceType,
        obj: &Value,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.record(
            ObjectRef::of(rt, obj),
            EventType::Warning,
            reason,
            message.into(),
        );
    }

    /// Queue one event; never waits.
    pub(crate) fn record(&self, object: ObjectRef, ty: EventType, reason: &str, message: String) {
        let p = Pending {
            object,
            ty,
            reason: cut(reason, MAX_REASON),
            message: cut(&message, MAX_MESSAGE),
        };
        if self.tx.try_send(p).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            metrics().dropped.inc();
        }
    }

    /// Events for what changed between two statuses of one object: `status.state`
    /// moving, and each condition that is new or changed its status or
    /// reason. A False condition is a Warning unless its reason says it is waiting.
    pub fn status_change(&self, rt: &ResourceType, obj: &Value, old: Option<&Value>, new: &Value) {
        for (ty, reason, message) in transitions(old, new) {
            self.record(ObjectRef::of(rt, obj), ty, &reason, message);
        }
    }
}

/// What [`Recorder::status_change`] records, as (type, reason, message).
pub(crate) fn transitions(old: Option<&Value>, new: &Value) -> Vec<(EventType, String, String)> {
    let mut out = Vec::new();
    // A claim's `phase` is not here: its `Bound` condition says the same, with why.
    let field = "state";
    let before = old.and_then(|o| o.get(field)).and_then(Value::as_str);
    if let Some(a) = new.get(field).and_then(Value::as_str) {
        if before != Some(a) {
            let msg = match before {
                Some(b) if !b.is_empty() => format!("{field} {b} -> {a}"),
                _ => format!("{field} {a}"),
            };
            out.push((EventType::Normal, "StateChanged".to_string(), msg));
        }
    }
    let conds = |v: Option<&Value>| -> Vec<Value> {
        v.and_then(|v| v.get("conditions"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let before = conds(old);
    for c in conds(Some(new)) {
        let ty = c.get("type").and_then(Value::as_str).unwrap_or("");
        let st = c.get("status").and_then(Value::as_str).unwrap_or("");
        let reason = c.get("reason").and_then(Value::as_str).unwrap_or("");
        let prev = before
            .iter()
            .find(|b| b.get("type").and_then(Value::as_str) == Some(ty));
        let same = prev.is_some_and(|p| {
            p.get("status").and_then(Value::as_str) == Some(st)
                && p.get("reason").and_then(Value::as_str) == Some(reason)
        });
        if same || ty.is_empty() {
            continue;
        }
        let waiting = matches!(
            reason,
            "Pending"
                | "Waiting"
                | "AwaitingRegistration"
                | "NoMatchingServer"
                | "AllMatchingServersTaken"
        );
        let level = if st == "False" && !waiting {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let message = c.get("message").and_then(Value::as_str).unwrap_or("");
        let reason = if reason.is_empty() { ty } else { reason };
        out.push((level, reason.to_string(), format!("{ty}={st}: {message}")));
    }
    out
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[derive(Hash, PartialEq, Eq)]
struct AggKey {
    object: ObjectRef,
    ty: EventType,
    reason: String,
    message: String,
}

struct Entry {
    name: String,
    count: u64,
    first: String,
    last: String,
    seen: Instant,
    written: Instant,
    dirty: bool,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// `<object name>.<16 hex digits>`, within the 253-character name limit.
fn event_name(object: &str) -> String {
    let n = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0))
    .wrapping_add(
        SEQ.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let mut base = cut(object, 253 - 17);
    while base.ends_with(['.', '-']) {
        base.pop();
    }
    format!("{base}.{n:016x}")
}

async fn write_loop(store: Store, component: &'static str, mut rx: mpsc::Receiver<Pending>) {
    let Some(rt) = store.registry().by_kind("v1", "Event") else {
        return;
    };
    let mut agg: HashMap<AggKey, Entry> = HashMap::new();
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    break;
                }
                let new: Vec<Value> = batch
                    .drain(..)
                    .filter_map(|p| take(component, &mut agg, p))
                    .collect();
                write_new(&store, &rt, new).await;
            }
            _ = tick.tick() => {
                flush(&store, &rt, component, &mut agg, false).await;
            }
        }
    }
    flush(&store, &rt, component, &mut agg, true).await;
}

/// Aggregate `p`: counted on an Event already written (`None`), or a new Event to write.
fn take(component: &'static str, agg: &mut HashMap<AggKey, Entry>, p: Pending) -> Option<Value> {
    let key = AggKey {
        object: p.object,
        ty: p.ty,
        reason: p.reason,
        message: p.message,
    };
    let at = now();
    if let Some(e) = agg.get_mut(&key) {
        if e.seen.elapsed() < AGGREGATE_WINDOW {
            e.count += 1;
            e.last = at;
            e.seen = Instant::now();
            e.dirty = true;
            return None;
        }
    }
    if agg.len() >= MAX_TRACKED {
        forget_oldest(agg);
    }
    let e = Entry {
        name: event_name(&key.object.name),
        count: 1,
        first: at.clone(),
        last: at,
        seen: Instant::now(),
        written: Instant::now(),
        dirty: false,
    };
    let obj = event_object(component, &key, &e);
    agg.insert(key, e);
    Some(obj)
}

/// Drop the least recently seen entries (a tenth of the map), writing any pending count.
fn forget_oldest(agg: &mut HashMap<AggKey, Entry>) {
    let mut seen: Vec<Instant> = agg.values().map(|e| e.seen).collect();
    seen.sort();
    let cutoff = seen[seen.len() / 10];
    agg.retain(|_, e| e.seen > cutoff);
}

fn event_object(component: &str, key: &AggKey, e: &Entry) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": e.name, "namespace": key.object.event_namespace()},
        "involvedObject": key.object.to_json(),
        "reason": key.reason,
        "message": key.message,
        "type": key.ty.as_str(),
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": e.first,
        "lastTimestamp": e.last,
        "count": e.count,
    })
}

/// Write new Events: one transaction for all (one revision on etcd, off every
/// reconciler's path); when it is refused (a name taken), one by one.
async fn write_new(store: &Store, rt: &ResourceType, events: Vec<Value>) {
    if events.is_empty() {
        return;
    }
    metrics().written.inc_by(events.len() as u64);
    if events.len() > 1 {
        let writes = events
            .iter()
            .map(|e| Write::Create(rt, e.clone()))
            .collect();
        if store.write_all(writes).await.is_ok() {
            return;
        }
    }
    for e in events {
        if let Err(err) = store.create(rt, e).await {
            tracing::debug!(error = %err, "event not written");
        }
    }
}

async fn flush(
    store: &Store,
    rt: &ResourceType,
    component: &str,
    agg: &mut HashMap<AggKey, Entry>,
    all: bool,
) {
    for (key, e) in agg.iter_mut() {
        if !e.dirty || (!all && e.written.elapsed() < FLUSH_EVERY) {
            continue;
        }
        e.dirty = false;
        e.written = Instant::now();
        let patch = json!({"count": e.count, "lastTimestamp": e.last});
        metrics().written.inc();
        match store
            .patch(
                rt,
                Some(key.object.event_namespace()),
                &e.name,
                &patch,
                Part::Main,
            )
            .await
        {
            Ok(_) => {}
            // Collected meanwhile: write it again.
            Err(StoreError::NotFound { .. }) => {
                write_new(store, rt, vec![event_object(component, key, e)]).await
            }
            Err(err) => tracing::debug!(error = %err, "event count not written"),
        }
    }
    agg.retain(|_, e| e.seen.elapsed() < AGGREGATE_WINDOW);
}

/// How often [`collect`] looks at the store's Events.
pub(crate) const COLLECT_EVERY: Duration = Duration::from_secs(30);

/// Keep the store's Events within `[events]`: delete those last seen more than
/// `ttl_secs` ago, then the oldest beyond `max_events`. Runs until `stop`.
pub async fn collect(
    store: Store,
    settings: EventSettings,
    stop: impl std::future::Future<Output = ()>,
) {
    let Some(rt) = store.registry().by_kind("v1", "Event") else {
        return;
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(COLLECT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let n = collect_once(&store, &rt, &settings).await;
        if n > 0 {
            tracing::debug!(deleted = n, "events collected");
        }
    }
}

/// One pass of [`collect`]; returns how many Events it deleted.
pub(crate) async fn collect_once(
    store: &Store,
    rt: &Arc<ResourceType>,
    settings: &EventSettings,
) -> usize {
    debug_assert_eq!(rt.kind, "Event");
    let cutoff = chrono::Utc::now() - chrono::Duration::seconds(settings.ttl_secs as i64);
    let cutoff = cutoff.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // (last timestamp, namespace, name); RFC 3339 UTC strings sort as times. Parsing up
    // to `max_events` objects is CPU work: on a blocking thread, not an async worker.
    let (st, ty) = (store.clone(), rt.clone());
    let listed = tokio::task::spawn_blocking(move || {
        let (items, _) = st.list(&ty, None, None);
        items
            .map(|e| {
                let last = e
                    .get("lastTimestamp")
                    .and_then(Value::as_str)
                    .or_else(|| {
                        e.pointer("/metadata/creationTimestamp")
                            .and_then(Value::as_str)
                    })
                    .unwrap_or("")
                    .to_string();
                (
                    last,
                    meta::namespace(&e).unwrap_or("default").to_string(),
                    meta::name(&e).to_string(),
                )
            })
            .collect::<Vec<_>>()
    })
    .await;
    let Ok(mut all) = listed else {
        return 0;
    };
    all.sort();
    let expired = all.partition_point(|(t, _, _)| *t < cutoff);
    let over = all.len().saturating_sub(settings.max_events);
    let doomed = expired.max(over);
    let mut deleted = 0;
    for (_, ns, name) in all.iter().take(doomed) {
        match store.delete(rt, Some(ns), name, None).await {
            Ok(_) => deleted += 1,
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(error = %e, "deleting an old event");
                break;
            }
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_name_state_and_condition_changes() {
        let old = json!({"state": "Available", "conditions": [
            {"type": "PowerReady", "status": "True", "reason": "Applied", "message": "on"}]});
        let new = json!({"state": "Reserved", "conditions": [
            {"type": "PowerReady", "status": "False", "reason": "DriverError", "message": "bmc down"},
            {"type": "Bound", "status": "False", "reason": "NoMatchingServer", "message": "none"}]});
        let t = transitions(Some(&old), &new);
        assert_eq!(t.len(), 3, "{t:?}");
        assert_eq!(
            t[0],
            (
                EventType::Normal,
                "StateChanged".into(),
                "state Available -> Reserved".into()
            )
        );
        assert_eq!(
            t[1],
            (
                EventType::Warning,
                "DriverError".into(),
                "PowerReady=False: bmc down".into()
            )
        );
        assert_eq!(t[2].0, EventType::Normal);
        assert!(transitions(Some(&new), &new).is_empty());
    }

    #[test]
    fn names_fit_and_differ() {
        let a = event_name(&"x".repeat(300));
        assert!(a.len() <= 253, "{}", a.len());
        assert_ne!(event_name("s1"), event_name("s1"));
        assert!(event_name("s1").starts_with("s1."));
    }

    fn server(store: &Store, name: &str) -> (std::sync::Arc<ResourceType>, Value) {
        let rt = store.registry().resolve("server").unwrap();
        let obj = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name, "uid": format!("uid-{name}")}});
        (rt, obj)
    }

    fn events_of(store: &Store) -> Vec<std::sync::Arc<Value>> {
        let rt = store.registry().by_kind("v1", "Event").unwrap();
        store.list(&rt, None, None).0.collect()
    }

    #[tokio::test]
    async fn the_same_event_again_is_one_event_with_a_count() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let rec = Recorder::spawn(store.clone(), "test-component");
        let (rt, s1) = server(&store, "s1");
        for _ in 0..5 {
            rec.normal(&rt, &s1, "PowerOn", "power On applied");
        }
        rec.warning(&rt, &s1, "DriverError", "bmc unreachable");
        drop(rec); // the writer flushes what it holds, then ends
        let mut evs = Vec::new();
        for _ in 0..100 {
            evs = events_of(&store);
            if evs.len() == 2 && evs.iter().any(|e| e["count"] == 5) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(evs.len(), 2, "{evs:?}");
        let on = evs.iter().find(|e| e["reason"] == "PowerOn").unwrap();
        assert_eq!(on["count"], 5, "{on}");
        assert_eq!(on["type"], "Normal");
        assert_eq!(on["involvedObject"]["kind"], "Server");
        assert_eq!(on["involvedObject"]["uid"], "uid-s1");
        assert_eq!(on["metadata"]["namespace"], "default");
        assert_eq!(on["source"]["component"], "test-component");
        let warn = evs.iter().find(|e| e["reason"] == "DriverError").unwrap();
        assert_eq!(
            (warn["type"].as_str(), warn["count"].as_u64()),
            (Some("Warning"), Some(1))
        );
    }

    #[tokio::test]
    async fn collection_keeps_the_newest_within_bounds_and_drops_the_expired() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let rt = store.registry().by_kind("v1", "Event").unwrap();
        let old = (chrono::Utc::now() - chrono::Duration::hours(2))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mk = |i: usize, last: &str| {
            json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("e{i:04}"), "namespace": "default"},
                "involvedObject": {"kind": "Server", "name": "s"}, "reason": "R", "message": "m",
                "type": "Normal", "count": 1, "lastTimestamp": last})
        };
        for i in 0..10 {
            store.create(&rt, mk(i, &old)).await.unwrap();
        }
        for i in 10..160 {
            // Newer as i grows (seconds apart, all within the TTL).
            let t = (chrono::Utc::now() - chrono::Duration::seconds(1000 - i as i64))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            store.create(&rt, mk(i, &t)).await.unwrap();
        }
        let settings = EventSettings {
            ttl_secs: 3600,
            max_events: 100,
        };
        let n = collect_once(&store, &rt, &settings).await;
        assert_eq!(n, 60, "10 expired + 50 over the limit");
        let left: Vec<String> = events_of(&store)
            .iter()
            .map(|e| meta::name(e).to_string())
            .collect();
        assert_eq!(left.len(), 100);
        assert_eq!(
            left.first().map(String::as_str),
            Some("e0060"),
            "the oldest went first"
        );
        assert_eq!(collect_once(&store, &rt, &settings).await, 0);
        assert!(EventSettings {
            ttl_secs: 5,
            max_events: 100
        }
        .validate()
        .is_err());
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        // A current-thread runtime: the writer cannot run while this loop queues.
        let rec = Recorder::spawn(store.clone(), "test");
        let (rt, s1) = server(&store, "s1");
        for i in 0..(QUEUE + 10) {
            rec.normal(&rt, &s1, "Spam", format!("message {i}"));
        }
        assert_eq!(rec.dropped(), 10);
    }

    #[test]
    fn cuts_on_char_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }
}
