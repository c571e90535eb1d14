//! Read-modify-write retried on conflicts (client-go's `RetryOnConflict`), written once:
//! [`Store::modify_status`] for the status writers (a change computed from the object
//! as read, written against that version, recomputed from a fresh read when someone
//! wrote in between), and [`retry_on_conflict`] / [`retry_if`] for writers whose one
//! attempt is more than a status write.
//!
//! Retries are bounded ([`ATTEMPTS`]); when every attempt met a conflict the last
//! `Conflict` is returned, its message saying how many attempts were made.

use std::future::Future;
use std::sync::Arc;

use serde_json::{json, Value};

use super::backend::KvBackend;
use super::{Result, Store, StoreError};
use bootplane_model::registry::ResourceType;

/// How many times a read-modify-write is tried before its conflict is returned.
pub(crate) const ATTEMPTS: usize = 8;

/// Whether `e` is a `Conflict` (the object changed since it was read).
pub(crate) fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::Conflict { .. })
}

/// Run `attempt` until it returns anything but a `Conflict`, at most `attempts` times.
pub async fn retry_on_conflict<T, F, Fut>(attempts: usize, attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    retry_if(attempts, is_conflict, attempt).await
}

/// Run `attempt` until it returns `Ok` or an error `retriable` refuses, at most
/// `attempts` times (at least once). When every attempt failed retriably, the last
/// error is returned; a `Conflict`'s message then says how many attempts were made.
pub async fn retry_if<T, F, Fut>(
    attempts: usize,
    retriable: impl Fn(&StoreError) -> bool,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let attempts = attempts.max(1);
    let mut last = None;
    for _ in 0..attempts {
        match attempt().await {
            Err(e) if retriable(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(match last.expect("at least one attempt") {
        StoreError::Conflict {
            qualified,
            name,
            message,
        } => StoreError::Conflict {
            qualified,
            name,
            message: format!("{message} (gave up after {attempts} attempts)"),
        },
        e => e,
    })
}

/// What [`Store::modify_status`] did.
#[derive(Debug, Clone)]
pub enum Modified {
    /// Nothing written: the change left the status as stored, or the modifier declined
    /// (the object as read no longer wants it). The object as last read.
    Unchanged(Arc<Value>),
    /// The status was written: the object it was computed from (`before`; its old
    /// status is `before["status"]`) and the object as stored after.
    Written {
        before: Arc<Value>,
        after: Arc<Value>,
    },
}

impl<B: KvBackend> Store<B> {
    /// Read object `name`, let `modify` change a copy of its status (`{}` when it has
    /// none) and write it back against the version read; on a `Conflict`, read again and
    /// modify again, at most [`ATTEMPTS`] times in all. `modify` gets the object as read
    /// and the status to change, and returns `false` to write nothing (the object no
    /// longer wants this change). A status left equal to the stored one is not written.
    /// Errors are the store's (`NotFound` when the object is gone, `Conflict` when every
    /// attempt met one).
    pub async fn modify_status(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        mut modify: impl FnMut(&Arc<Value>, &mut Value) -> bool,
    ) -> Result<Modified> {
        retry_on_conflict(ATTEMPTS, || {
            let read = self.get(rt, ns, name).map(|cur| {
                let mut status = cur.get("status").cloned().unwrap_or_else(|| json!({}));
                let write = modify(&cur, &mut status) && cur.get("status") != Some(&status);
                (cur, write.then_some(status))
            });
            async move {
                match read? {
                    (cur, None) => Ok(Modified::Unchanged(cur)),
                    (cur, Some(status)) => {
                        let after = self.update_status(rt, &cur, status).await?;
                        Ok(Modified::Written { before: cur, after })
                    }
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_model::registry::Registry;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn conflict() -> StoreError {
        StoreError::Conflict {
            qualified: "servers.metal.ironcore.dev".into(),
            name: "s1".into(),
            message: "the object has been modified".into(),
        }
    }

    #[tokio::test]
    async fn retries_conflicts_then_gives_up_with_a_clear_error() {
        let calls = AtomicUsize::new(0);
        let r = retry_on_conflict(4, || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(conflict()),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(r, Ok(2), "two conflicts, then success");
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicUsize::new(0);
        let r: Result<()> = retry_on_conflict(4, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(conflict())
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "bounded");
        let e = r.unwrap_err();
        assert!(is_conflict(&e));
        assert!(
            e.to_string()
                .ends_with("the object has been modified (gave up after 4 attempts)"),
            "{e}"
        );

        // Other errors are not retried.
        let calls = AtomicUsize::new(0);
        let r: Result<()> = retry_on_conflict(4, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::BadRequest("no".into()))
        })
        .await;
        assert_eq!(r, Err(StoreError::BadRequest("no".into())));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // retry_if: what the predicate accepts is retried, and returned as is at the end.
        let calls = AtomicUsize::new(0);
        let gone = || StoreError::AlreadyExists {
            qualified: "q".into(),
            name: "n".into(),
        };
        let r: Result<()> = retry_if(
            3,
            |e| matches!(e, StoreError::AlreadyExists { .. }),
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(gone())
            },
        )
        .await;
        assert_eq!((r, calls.load(Ordering::SeqCst)), (Err(gone()), 3));
    }

    fn server(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000001"}})
    }

    /// A write between the read and the write of `modify_status` (made from inside the
    /// modifier, the first time): the conflict is met, the object read again and the
    /// change made on the newer status, so neither write is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn modify_status_conflict_then_success() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let t = Registry::global().resolve("server").unwrap();
        store.create(&t, server("s1")).await.unwrap();
        let calls = AtomicUsize::new(0);
        let r = store
            .modify_status(&t, None, "s1", |cur, st| {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    let other = json!({"powerState": "On"});
                    tokio::task::block_in_place(|| {
                        tokio::runtime::Handle::current()
                            .block_on(store.update_status(&t, cur, other))
                    })
                    .unwrap();
                }
                st["state"] = json!("Available");
                true
            })
            .await
            .unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "modified again after the conflict"
        );
        let Modified::Written { before, after } = r else {
            panic!("not written: {r:?}");
        };
        assert_eq!(before["status"], json!({"powerState": "On"}));
        assert_eq!(
            after["status"],
            json!({"powerState": "On", "state": "Available"})
        );
        assert_eq!(store.get(&t, None, "s1").unwrap(), after);

        // Equal, or declined: nothing written.
        let r = store
            .modify_status(&t, None, "s1", |_, st| {
                st["state"] = json!("Available");
                true
            })
            .await
            .unwrap();
        assert!(
            matches!(r, Modified::Unchanged(ref o) if *o == after),
            "{r:?}"
        );
        let r = store
            .modify_status(&t, None, "s1", |_, st| {
                st["state"] = json!("Error");
                false
            })
            .await
            .unwrap();
        assert!(matches!(r, Modified::Unchanged(_)));
        assert_eq!(store.get(&t, None, "s1").unwrap(), after);
        // Gone: the store's NotFound.
        let r = store.modify_status(&t, None, "nope", |_, _| true).await;
        assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    }

    /// Someone writes between every read and write: bounded, then a clear conflict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn modify_status_retries_exhausted() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let t = Registry::global().resolve("server").unwrap();
        store.create(&t, server("s2")).await.unwrap();
        let calls = AtomicUsize::new(0);
        let r = store
            .modify_status(&t, None, "s2", |cur, st| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let other = json!({"manufacturer": format!("write {n}")});
                tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(store.update_status(&t, cur, other))
                })
                .unwrap();
                st["state"] = json!("Available");
                true
            })
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
        let e = r.unwrap_err();
        assert!(is_conflict(&e), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("(gave up after {ATTEMPTS} attempts)")),
            "{e}"
        );
        let s = store.get(&t, None, "s2").unwrap();
        assert_eq!(
            s["status"]["manufacturer"],
            format!("write {}", ATTEMPTS - 1)
        );
        assert!(s["status"].get("state").is_none());
    }
}
