//! A work queue as controller-runtime has it: a key is queued at most once; a key
//! added while it is being processed is processed again afterwards (never twice at
//! once); failures are retried with per-key exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

struct Inner<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
    shutdown: bool,
}

pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
}

pub(crate) const BASE_DELAY: Duration = Duration::from_millis(5);
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(30);

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(WorkQueue {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                shutdown: false,
            }),
            notify: Notify::new(),
        })
    }

    /// Queue `k` unless it is already queued; if it is being processed, queue it
    /// again once that finishes.
    pub(crate) fn add(&self, k: K) {
        let mut g = self.inner.lock().unwrap();
        if g.shutdown {
            return;
        }
        if g.processing.contains(&k) {
            g.dirty.insert(k);
            return;
        }
        if g.queued.insert(k.clone()) {
            g.queue.push_back(k);
            drop(g);
            self.notify.notify_one();
        }
    }

    /// Queue `k` after `d`.
    pub(crate) fn add_after(self: &Arc<Self>, k: K, d: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            q.add(k);
        });
    }

    /// Retry `k` after its backoff delay, which doubles with each failure.
    pub(crate) fn add_rate_limited(self: &Arc<Self>, k: K) {
        let n = {
            let mut g = self.inner.lock().unwrap();
            let n = g.failures.entry(k.clone()).or_insert(0);
            *n += 1;
            *n
        };
        self.add_after(k, backoff(n));
    }

    /// Reset `k`'s backoff after a success.
    pub(crate) fn forget(&self, k: &K) {
        self.inner.lock().unwrap().failures.remove(k);
    }

    /// Next key to process; `None` after shutdown.
    pub(crate) async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut g = self.inner.lock().unwrap();
                if g.shutdown {
                    return None;
                }
                if let Some(k) = g.queue.pop_front() {
                    g.queued.remove(&k);
                    g.processing.insert(k.clone());
                    if !g.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(k);
                }
            }
            notified.await;
        }
    }

    /// Mark `k` finished; re-queues it if it was added meanwhile.
    pub(crate) fn done(&self, k: &K) {
        let mut g = self.inner.lock().unwrap();
        g.processing.remove(k);
        if g.dirty.remove(k) && g.queued.insert(k.clone()) {
            g.queue.push_back(k.clone());
            drop(g);
            self.notify.notify_one();
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn shutdown(&self) {
        self.inner.lock().unwrap().shutdown = true;
        self.notify.notify_waiters();
    }
}

pub(crate) fn backoff(failures: u32) -> Duration {
    BASE_DELAY
        .saturating_mul(1u32 << failures.min(20))
        .min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_dirty() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let k = q.get().await.unwrap();
        assert_eq!(k, "a");
        q.add("a"); // while processing: deferred
        assert_eq!(q.len(), 1);
        q.done(&k);
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.unwrap(), "b");
        assert_eq!(q.get().await.unwrap(), "a");
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(10));
        assert!(backoff(3) > backoff(2));
        assert_eq!(backoff(40), MAX_DELAY);
    }

    #[tokio::test]
    async fn shutdown_releases_waiters() {
        let q: Arc<WorkQueue<u32>> = WorkQueue::new();
        let q2 = q.clone();
        let t = tokio::spawn(async move { q2.get().await });
        tokio::task::yield_now().await;
        q.shutdown();
        assert_eq!(t.await.unwrap(), None);
    }
}
