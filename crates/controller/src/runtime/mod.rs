//! The one controller runtime every set of reconcilers runs on, metal and
//! provisioning alike.
//!
//! - **Watches feed queues**: each watched type is followed by a
//!   [`crate::store::watcher::Watcher`] (list, watch from the listing's revision,
//!   re-list after a 410) in a task of its own, and every listed object and change is
//!   handed to the set's event handler, which keeps its indexes and adds the keys the
//!   change concerns to the reconcilers' queues.
//! - **Dedup queues with in-flight tracking** ([`queue::WorkQueue`]): a key is queued
//!   at most once, and a key added while it is being reconciled is reconciled again
//!   afterwards, never twice at once.
//! - **Workers**: each reconciler gets `workers` tasks taking keys off its queue
//!   (the count is the controller set's choice: the metal set passes
//!   `controller.workers`, more of them meaning bigger group commits).
//!   Reconcilers are level-triggered and idempotent (they read the current objects,
//!   act, and write with compare-and-swap), so a restart at any point just
//!   reconciles again from what is stored.
//! - **Backoff**: [`Next::After`] requeues a key after a delay; an error retries it
//!   with per-key exponential backoff (conflicts quietly), reset by a success.
//! - **Drain on shutdown**: the queues stop handing out keys, the watches stop, and
//!   reconciles in flight get [`DRAIN`] to finish before they are cancelled.
//!
//! A controller set is a context type `C` holding its store, queues and indexes:
//!
//! ```text
//! Runtime::new(ctx.clone(), ctx.store.clone(), workers)
//!     .watch([ctx.t_a.clone(), ctx.t_b.clone()], |c: &Ctx, t, obj, deleted| {
//!         c.dispatch(t, obj, deleted) // adds keys to c.queue_a, c.queue_b
//!     })
//!     .reconciler("a", ctx.queue_a.clone(), |c, k| async move { c.reconcile_a(&k).await })
//!     .reconciler("b", ctx.queue_b.clone(), |c, k| async move { c.reconcile_b(&k).await })
//!     .run(shutdown)
//!     .await;
//! ```
//!
//! A reconcile function takes the context and the key by value (so its future can be
//! spawned) and returns `Result<Next, StoreError>`.

pub mod metrics;
pub mod queue;

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinSet;

use crate::model::registry::ResourceType;
use crate::shutdown::Shutdown;
use crate::store::watcher::{Batch, Watcher};
use crate::store::{Store, StoreError};
use queue::WorkQueue;

/// How long reconciles in flight at shutdown may take to finish.
pub(crate) const DRAIN: Duration = Duration::from_secs(2);

/// What a reconcile asks of the runtime afterwards.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Done,
    After(Duration),
}

/// An event handler: `(context, type, object, deleted)`.
type Handler<C> = Arc<dyn Fn(&C, &ResourceType, &Arc<Value>, bool) + Send + Sync>;

/// Starts one reconciler's workers into the set.
type Start<C> = Box<dyn FnOnce(&Arc<C>, usize, &mut JoinSet<()>) + Send>;

/// See the module doc.
pub(crate) struct Runtime<C> {
    ctx: Arc<C>,
    store: Store,
    workers: usize,
    watches: Vec<(Arc<ResourceType>, Handler<C>)>,
    starts: Vec<Start<C>>,
    stops: Vec<Box<dyn Fn() + Send>>,
}

impl<C: Send + Sync + 'static> Runtime<C> {
    /// A runtime for the controller set `ctx`, with `workers` (at least 1) tasks per
    /// reconciler.
    pub(crate) fn new(ctx: Arc<C>, store: Store, workers: usize) -> Runtime<C> {
        Runtime {
            ctx,
            store,
            workers: workers.max(1),
            watches: Vec::new(),
            starts: Vec::new(),
            stops: Vec::new(),
        }
    }

    /// Follow each of `types` and hand every object listed and every change to
    /// `on_event(ctx, type, object, deleted)`.
    pub(crate) fn watch<F>(
        mut self,
        types: impl IntoIterator<Item = Arc<ResourceType>>,
        on_event: F,
    ) -> Self
    where
        F: Fn(&C, &ResourceType, &Arc<Value>, bool) + Send + Sync + 'static,
    {
        let h: Handler<C> = Arc::new(on_event);
        for t in types {
            self.watches.push((t, h.clone()));
        }
        self
    }

    /// Reconcile the keys of `queue` with `reconcile(ctx, key)`; `kind` names them in
    /// the logs.
    pub(crate) fn reconciler<K, F, Fut>(
        mut self,
        kind: &'static str,
        queue: Arc<WorkQueue<K>>,
        reconcile: F,
    ) -> Self
    where
        K: Clone + Eq + Hash + Send + Sync + Debug + 'static,
        F: Fn(Arc<C>, K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Next, StoreError>> + Send + 'static,
    {
        let q = queue.clone();
        self.stops.push(Box::new(move || q.shutdown()));
        let reconcile = Arc::new(reconcile);
        self.starts.push(Box::new(move |ctx, workers, tasks| {
            for _ in 0..workers {
                let (ctx, q, f) = (ctx.clone(), queue.clone(), reconcile.clone());
                tasks.spawn(async move {
                    while let Some(k) = q.get().await {
                        let started = std::time::Instant::now();
                        let r = f(ctx.clone(), k.clone()).await;
                        let result = match &r {
                            Ok(Next::Done) => "done",
                            Ok(Next::After(_)) => "requeue",
                            Err(StoreError::Conflict { .. }) => "conflict",
                            Err(_) => "error",
                        };
                        metrics::global().observe(kind, result, started.elapsed());
                        finish(&q, k, r, kind);
                    }
                });
            }
        }));
        self
    }

    /// Run the watches and workers until `shutdown`, then drain (see the module doc).
    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        let mut watches = JoinSet::new();
        for (t, h) in self.watches {
            let (ctx, store) = (self.ctx.clone(), self.store.clone());
            watches
                .spawn(async move { watch_loop(&store, t, |t, o, del| h(&ctx, t, o, del)).await });
        }
        let mut workers = JoinSet::new();
        for start in self.starts {
            start(&self.ctx, self.workers, &mut workers);
        }
        shutdown.recv().await;
        for stop in &self.stops {
            stop();
        }
        watches.abort_all();
        while watches.join_next().await.is_some() {}
        // Idle workers see the stopped queues and end; busy ones finish their reconcile.
        let drained = tokio::time::timeout(DRAIN, async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("reconciles still running after {DRAIN:?}, cancelled");
            workers.abort_all();
            while workers.join_next().await.is_some() {}
        }
    }
}

/// Follow `t` with a [`Watcher`]: hand every listed object to `dispatch`, then each
/// change (`deleted` for DELETED); a re-listing after a 410 hands out every object
/// again. Returns when the store closes.
pub(crate) async fn watch_loop(
    store: &Store,
    t: Arc<ResourceType>,
    dispatch: impl Fn(&ResourceType, &Arc<Value>, bool),
) {
    let mut w = Watcher::new(store.clone(), "controller").with(t);
    while let Some(batch) = w.next().await {
        match batch {
            Batch::Listed(objects) => {
                for (t, o) in objects {
                    dispatch(&t, &o, false);
                }
            }
            Batch::Events(changes) => {
                for c in changes {
                    dispatch(&c.t, &c.event.object, c.deleted());
                }
            }
        }
    }
}

/// After a reconcile of `k` from `q`: forget or requeue it as the result asks, retry
/// failures with backoff (conflicts quietly), and mark it done.
pub(crate) fn finish<K: Clone + Eq + Hash + Send + Debug + 'static>(
    q: &Arc<WorkQueue<K>>,
    k: K,
    r: Result<Next, StoreError>,
    what: &str,
) {
    match r {
        Ok(Next::Done) => q.forget(&k),
        Ok(Next::After(d)) => {
            q.forget(&k);
            q.add_after(k.clone(), d);
        }
        Err(e) => {
            if matches!(e, StoreError::Conflict { .. }) {
                tracing::debug!(kind = what, key = ?k, error = %e, "reconcile conflict, retrying");
            } else {
                tracing::warn!(kind = what, key = ?k, error = %e, "reconcile failed, retrying with backoff");
            }
            q.add_rate_limited(k.clone());
        }
    }
    q.done(&k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::meta;
    use crate::model::registry::Registry;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    struct Ctx {
        q: Arc<WorkQueue<String>>,
        seen: Mutex<Vec<String>>,
        running: AtomicUsize,
        most: AtomicUsize,
        fails: AtomicUsize,
    }

    #[tokio::test]
    async fn watches_feed_workers_with_retries_and_drain() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let t = Registry::global().resolve("server").unwrap();
        for n in ["a", "b", "c", "d"] {
            store
                .create(
                    &t,
                    serde_json::json!({"metadata": {"name": n}, "spec": {"systemUUID": uuid::Uuid::new_v4().to_string()}}),
                )
                .await
                .unwrap();
        }
        let ctx = Arc::new(Ctx {
            q: WorkQueue::new(),
            seen: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            fails: AtomicUsize::new(0),
        });
        let coord = crate::shutdown::Coordinator::new();
        let rt = Runtime::new(ctx.clone(), store.clone(), 2)
            .watch([t.clone()], |c: &Ctx, _t, o, _del| {
                c.q.add(meta::name(o).to_string())
            })
            .reconciler("test", ctx.q.clone(), |c: Arc<Ctx>, k: String| async move {
                let n = c.running.fetch_add(1, Ordering::SeqCst) + 1;
                c.most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                c.running.fetch_sub(1, Ordering::SeqCst);
                // "a" fails once: retried after its backoff.
                if k == "a" && c.fails.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(StoreError::Internal("once".into()));
                }
                c.seen.lock().unwrap().push(k);
                Ok(Next::Done)
            });
        let run = tokio::spawn(rt.run(coord.handle()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ctx.seen.lock().unwrap().len() < 4 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "reconciled everything"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut seen = ctx.seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, ["a", "b", "c", "d"]);
        assert_eq!(ctx.most.load(Ordering::SeqCst), 2, "two workers");
        // A reconcile in flight at shutdown finishes before run returns.
        ctx.q.add("e".into());
        while ctx.running.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(coord.drain(Duration::from_secs(5)).await);
        run.await.unwrap();
        assert_eq!(ctx.running.load(Ordering::SeqCst), 0);
        assert!(ctx.seen.lock().unwrap().contains(&"e".to_string()));
    }
}
