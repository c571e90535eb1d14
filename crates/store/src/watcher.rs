//! The one list → watch → re-list loop every store consumer runs (the controllers'
//! watches, the boot side's index, the DHCP reservations).
//!
//! A [`Watcher`] follows a set of resource types. Its first [`Watcher::next`] lists
//! them and starts a watch of each from the revision its listing was read at, so no
//! change is missed or seen twice; later calls hand out the changes. When a watch
//! expires (`Gone`: its revision was compacted, or it fell further behind than the
//! store's event log) every watch is dropped and the next call lists again; a consumer
//! treats each [`Batch::Listed`] as the whole truth (objects deleted meanwhile have no
//! event left to say so). [`Watcher::next`] returns `None` once the store has closed.
//!
//! Events come in [`Batch::Events`]: the one that woke the watcher and every one
//! already waiting behind it (up to [`Watcher::max_batch`]), taken one at a time as
//! the batch is iterated (each is parsed when taken, so a batch does not hold a burst
//! of parsed objects at once). A consumer that is expensive per change (a merge of the
//! whole reservation list, a boot-index refresh) applies the batch and acts once.
//!
//! ```text
//! let mut w = Watcher::new(store.clone(), "dhcp reservations").with(t_server);
//! while let Some(batch) = w.next().await {       // cancel-safe: select! on shutdown
//!     match batch {
//!         Batch::Listed(objects) => for (t, o) in objects { /* rebuild */ },
//!         Batch::Events(changes) => for c in changes { /* c.t, c.event */ },
//!     }
//! }
//! ```
//!
//! Types added with [`Watcher::with_unlisted`] are watched but not listed: the boot
//! side lists Servers only and re-derives what the other types contribute from them,
//! so it watches those from the Servers' listing revision.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use serde_json::Value;

use super::backend::{KvBackend, KvWatch};
use super::engine::Backend;
use super::kv::Rev;
use super::{ObjectEvent, ObjectWatch, Objects, Store, StoreError};
use bootplane_model::registry::ResourceType;

/// Most events in one batch unless [`Watcher::max_batch`] says otherwise.
pub(crate) const DEFAULT_MAX_BATCH: usize = 4096;
/// Pause before listing again when starting a watch after a listing failed.
const RETRY: Duration = Duration::from_millis(100);

type EventStream = Pin<Box<dyn Stream<Item = Result<ObjectEvent, StoreError>> + Send>>;

/// One type's watch as a stream: its state (the in-flight `next`) lives here, across
/// polls, so a dropped [`Watcher::next`] loses nothing.
fn stream<W: KvWatch>(w: ObjectWatch<W>) -> EventStream {
    Box::pin(futures::stream::unfold(w, |mut w| async move {
        let r = w.next().await;
        Some((r, w))
    }))
}

/// A change to an object of type `t`.
#[derive(Debug, Clone)]
pub struct Change {
    pub t: Arc<ResourceType>,
    pub event: ObjectEvent,
}

impl Change {
    pub fn deleted(&self) -> bool {
        self.event.kind == "DELETED"
    }
}

/// What [`Watcher::next`] hands out.
pub enum Batch<'w, B: KvBackend = Backend> {
    /// Every object of the listed types, now (the first batch, and after each `Gone`).
    Listed(Listing),
    /// Changes since the previous batch.
    Events(Events<'w, B>),
}

/// The objects of a (re-)listing with their types, parsed as they are taken.
pub struct Listing {
    /// The revision the first listed type was read at (the one unlisted types are
    /// watched from).
    pub rev: Rev,
    parts: std::vec::IntoIter<(Arc<ResourceType>, Objects<'static>)>,
    cur: Option<(Arc<ResourceType>, Objects<'static>)>,
}

impl Iterator for Listing {
    type Item = (Arc<ResourceType>, Arc<Value>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((t, objs)) = &mut self.cur {
                if let Some(o) = objs.next() {
                    return Some((t.clone(), o));
                }
            }
            self.cur = Some(self.parts.next()?);
        }
    }
}

/// The changes of one batch: the first, then those already waiting (see the module
/// doc). Dropping it early leaves the rest for the next batch.
pub struct Events<'w, B: KvBackend = Backend> {
    w: &'w mut Watcher<B>,
    first: Option<Change>,
    taken: usize,
}

impl<B: KvBackend> Iterator for Events<'_, B> {
    type Item = Change;

    fn next(&mut self) -> Option<Change> {
        if let Some(c) = self.first.take() {
            self.taken = 1;
            return Some(c);
        }
        if self.taken >= self.w.max_batch {
            return None;
        }
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let Poll::Ready((i, r)) = self.w.poll_any(&mut cx) else {
            return None;
        };
        // `None`: the watches are gone (re-list or closed), and so is the batch.
        let c = self.w.take(i, r)?;
        self.taken += 1;
        Some(c)
    }
}

/// See the module doc.
pub struct Watcher<B: KvBackend = Backend> {
    store: Store<B>,
    /// What the logs call this watcher.
    name: &'static str,
    /// The followed types and whether each is listed.
    types: Vec<(Arc<ResourceType>, bool)>,
    /// One per type while watching; empty until listed.
    watches: Vec<EventStream>,
    /// Which watch is polled first next (so a busy type cannot starve the others).
    turn: usize,
    max_batch: usize,
    relist: bool,
    closed: bool,
}

impl<B: KvBackend> Watcher<B> {
    /// A watcher of nothing yet; `name` is what its log lines say.
    pub fn new(store: Store<B>, name: &'static str) -> Self {
        Watcher {
            store,
            name,
            types: Vec::new(),
            watches: Vec::new(),
            turn: 0,
            max_batch: DEFAULT_MAX_BATCH,
            relist: true,
            closed: false,
        }
    }

    /// Also list and watch `t` (every namespace).
    pub fn with(mut self, t: Arc<ResourceType>) -> Self {
        self.types.push((t, true));
        self
    }

    /// Also watch `t`, without listing it (see the module doc).
    pub fn with_unlisted(mut self, t: Arc<ResourceType>) -> Self {
        self.types.push((t, false));
        self
    }

    /// At most `n` (at least 1) events per [`Batch::Events`].
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Make the next [`Watcher::next`] list again (a consumer whose own inputs changed).
    pub fn relist(&mut self) {
        self.relist = true;
        self.watches.clear();
    }

    /// The next batch; `None` once the store has closed. Cancel-safe.
    pub async fn next(&mut self) -> Option<Batch<'_, B>> {
        loop {
            if self.closed {
                return None;
            }
            if self.relist {
                match self.list() {
                    Some(l) => {
                        self.relist = false;
                        return Some(Batch::Listed(l));
                    }
                    None => {
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            let (i, r) = std::future::poll_fn(|cx| self.poll_any(cx)).await;
            if let Some(c) = self.take(i, r) {
                return Some(Batch::Events(Events {
                    w: self,
                    first: Some(c),
                    taken: 0,
                }));
            }
        }
    }

    /// List the listed types and start every watch; `None` (logged) when a watch could
    /// not start.
    fn list(&mut self) -> Option<Listing> {
        self.watches.clear();
        let mut parts = Vec::new();
        let mut revs = Vec::with_capacity(self.types.len());
        for (t, listed) in &self.types {
            if *listed {
                let (objs, rev) = self.store.list(t, None, None);
                parts.push((t.clone(), objs));
                revs.push(Some(rev));
            } else {
                revs.push(None);
            }
        }
        let base = revs
            .iter()
            .flatten()
            .next()
            .copied()
            .unwrap_or_else(|| self.store.revision());
        for ((t, _), rev) in self.types.iter().zip(revs) {
            match self.store.watch(t, None, rev.unwrap_or(base)) {
                Ok(w) => self.watches.push(stream(w)),
                Err(e) => {
                    tracing::warn!(watcher = self.name, kind = %t.kind, error = %e, "watch failed, re-listing");
                    self.watches.clear();
                    return None;
                }
            }
        }
        Some(Listing {
            rev: base,
            parts: parts.into_iter(),
            cur: None,
        })
    }

    /// The first watch (from `turn` on) with something to say.
    fn poll_any(&mut self, cx: &mut Context<'_>) -> Poll<(usize, Result<ObjectEvent, StoreError>)> {
        let n = self.watches.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            match self.watches[i].as_mut().poll_next(cx) {
                Poll::Ready(r) => {
                    self.turn = (i + 1) % n;
                    return Poll::Ready((
                        i,
                        r.unwrap_or(Err(StoreError::Internal("watch ended".into()))),
                    ));
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    /// An event from watch `i` as a change, or `None` after setting `relist` (`Gone`)
    /// or `closed` (anything else: the store closed).
    fn take(&mut self, i: usize, r: Result<ObjectEvent, StoreError>) -> Option<Change> {
        let t = &self.types[i].0;
        match r {
            Ok(event) => Some(Change {
                t: t.clone(),
                event,
            }),
            Err(StoreError::Gone(m)) => {
                tracing::info!(watcher = self.name, kind = %t.kind, "watch expired ({m}), re-listing");
                self.relist();
                None
            }
            Err(e) => {
                tracing::debug!(watcher = self.name, kind = %t.kind, error = %e, "watch ended");
                self.watches.clear();
                self.closed = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Compare, Op, EVENT_LOG_CAP};
    use bootplane_model::registry::Registry;
    use serde_json::json;

    fn rt(name: &str) -> Arc<ResourceType> {
        Registry::global().resolve(name).unwrap()
    }

    async fn server(s: &Store, name: &str) {
        s.create(
            &rt("server"),
            json!({"metadata": {"name": name}, "spec": {"systemUUID": uuid::Uuid::new_v4().to_string()}}),
        )
        .await
        .unwrap();
    }

    fn names(l: Listing) -> Vec<String> {
        l.map(|(_, o)| bootplane_model::meta::name(&o).to_string())
            .collect()
    }

    fn changes(b: Option<Batch<'_>>) -> Vec<(String, String)> {
        match b {
            Some(Batch::Events(e)) => e
                .map(|c| {
                    (
                        c.t.kind.clone(),
                        bootplane_model::meta::name(&c.event.object).to_string(),
                    )
                })
                .collect(),
            Some(Batch::Listed(_)) => panic!("a listing, not events"),
            None => panic!("ended"),
        }
    }

    #[tokio::test]
    async fn lists_then_takes_waiting_events_together() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        server(&s, "a").await;
        let mut w = Watcher::new(s.clone(), "test")
            .with(rt("server"))
            .with_unlisted(rt("secret"));
        match w.next().await {
            Some(Batch::Listed(l)) => assert_eq!(names(l), ["a"]),
            _ => panic!("first batch is a listing"),
        }
        for n in ["b", "c", "d"] {
            server(&s, n).await;
        }
        s.create(&rt("secret"), json!({"metadata": {"name": "k"}}))
            .await
            .unwrap();
        let mut got = changes(w.next().await);
        got.sort();
        assert_eq!(
            got,
            [
                ("Secret", "k"),
                ("Server", "b"),
                ("Server", "c"),
                ("Server", "d")
            ]
            .map(|(k, n)| (k.to_string(), n.to_string()))
        );
        // A cap splits a burst into batches, nothing lost or repeated.
        let mut w = w.max_batch(2);
        for n in ["e", "f", "g"] {
            server(&s, n).await;
        }
        assert_eq!(changes(w.next().await).len(), 2);
        assert_eq!(changes(w.next().await).len(), 1);
        // A deletion says so.
        s.delete(&rt("server"), None, "a", None).await.unwrap();
        match w.next().await {
            Some(Batch::Events(mut e)) => assert!(e.next().unwrap().deleted()),
            _ => panic!("events"),
        }
    }

    #[tokio::test]
    async fn relists_when_the_watch_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        server(&s, "a").await;
        let mut w = Watcher::new(s.clone(), "test").with(rt("server"));
        assert!(matches!(w.next().await, Some(Batch::Listed(_))));
        server(&s, "b").await;
        // Push the watch's revision out of the event log.
        let writes: Vec<_> = (0..EVENT_LOG_CAP + 10)
            .map(|i| {
                s.kv()
                    .txn(vec![Op::put(format!("/x/{i}"), Compare::Any, json!(i))])
            })
            .collect();
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
        match w.next().await {
            Some(Batch::Listed(l)) => assert_eq!(names(l), ["a", "b"]),
            _ => panic!("a re-listing"),
        }
        // And it follows from the new listing.
        server(&s, "c").await;
        assert_eq!(
            changes(w.next().await),
            [("Server".to_string(), "c".to_string())]
        );
        // A consumer can ask for a listing too.
        w.relist();
        assert!(matches!(w.next().await, Some(Batch::Listed(_))));
    }

    #[tokio::test]
    async fn ends_when_the_store_closes() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let mut w = Watcher::new(s.clone(), "test").with(rt("server"));
        assert!(matches!(w.next().await, Some(Batch::Listed(_))));
        let waiting = tokio::spawn(async move {
            let end = w.next().await.is_none();
            (end, w.next().await.is_none())
        });
        tokio::task::yield_now().await;
        let s2 = s.clone();
        tokio::task::spawn_blocking(move || s2.close())
            .await
            .unwrap();
        assert_eq!(waiting.await.unwrap(), (true, true));
    }
}
