//! The writer thread: group commit of queued transactions (validate in order, write
//! the batch in one durable redb transaction, publish, acknowledge), with what a
//! commit unlinks freed on a reaper thread (see the parent module's doc).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::thread;

use redb::Database;
use serde_json::Value;
use tokio::sync::watch;

use super::text::stamp;
use super::{
    encode, storage, Action, Compare, Event, EventKind, Garbage, KeyValue, KvError, Msg, Op,
    Request, Rev, State, TxnResult, KV, MAX_BATCH, META, REAP_QUEUE,
};
use crate::seal::{is_sealed, Ledger};

pub(super) fn writer_loop(
    db: Database,
    state: Arc<RwLock<State>>,
    rx: std::sync::mpsc::Receiver<Msg>,
    events: watch::Sender<Rev>,
    ledger: Arc<Ledger>,
) {
    // Old versions are freed on a thread of their own: a parsed object is hundreds of
    // allocations, mostly made on other threads, and freeing them took a quarter of
    // the writer's time, which every commit waits on. At most a few commits' garbage
    // waits (the writer blocks after acknowledging), so memory is not held longer.
    let (reap, reaped) = std::sync::mpsc::sync_channel::<Garbage>(REAP_QUEUE);
    let reaper = thread::Builder::new()
        .name("store-reaper".into())
        .spawn(move || while reaped.recv().is_ok() {})
        .map_err(|e| tracing::warn!(error = %e, "no reaper thread, freeing on the writer"))
        .ok();
    let mut closing = None;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        match first {
            Msg::Txn(r) => batch.push(r),
            Msg::Close(done) => closing = Some(done),
        }
        while closing.is_none() && batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Msg::Txn(r)) => batch.push(r),
                Ok(Msg::Close(done)) => closing = Some(done),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let garbage = commit_batch(&db, &state, &events, &ledger, batch);
            if reaper.is_some() {
                let _ = reap.send(garbage);
            }
        }
        if closing.is_some() {
            break;
        }
    }
    drop(rx);
    drop(reap);
    if let Some(r) = reaper {
        let _ = r.join();
    }
    drop(db);
    // Watchers see `Closed` once they have read everything published.
    drop(events);
    tracing::debug!("store closed");
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

/// Whether `op` may apply to the key's value `cur` as the batch sees it.
pub(crate) fn compare(op: &Op, cur: Option<&KeyValue>) -> Result<(), KvError> {
    match (op.compare, cur) {
        (Compare::Absent, Some(_)) => {
            return Err(KvError::AlreadyExists {
                key: op.key.clone(),
            })
        }
        (Compare::Exists | Compare::ModRev(_), None) => {
            return Err(KvError::NotFound {
                key: op.key.clone(),
            })
        }
        (Compare::ModRev(want), Some(c)) if c.mod_rev != want => {
            return Err(KvError::Conflict {
                key: op.key.clone(),
                expected: want,
                actual: c.mod_rev,
            })
        }
        _ => {}
    }
    if matches!(op.action, Action::Delete) && cur.is_none() {
        return Err(KvError::NotFound {
            key: op.key.clone(),
        });
    }
    Ok(())
}

fn commit_batch(
    db: &Database,
    state: &Arc<RwLock<State>>,
    events: &watch::Sender<Rev>,
    ledger: &Ledger,
    mut batch: Vec<Request>,
) -> Garbage {
    let mut garbage = Garbage::default();
    // 1. Validate in order against committed state + what this batch already changed.
    let mut overlay: HashMap<Arc<str>, Option<KeyValue>> = HashMap::new();
    // The sealed texts (and keys) of the sealed types' latest puts in the batch.
    let mut seals: HashMap<Arc<str>, (Vec<u8>, Arc<str>)> = HashMap::new();
    let mut results: Vec<Result<TxnResult, KvError>> = Vec::with_capacity(batch.len());
    let mut evs: Vec<Event> = Vec::new();
    let base_rev;
    {
        let st = state.read().unwrap();
        base_rev = st.rev;
        let mut rev = st.rev;
        // A key's value as this batch sees it: its own earlier writes, else committed.
        let current =
            |k: &str, overlay: &HashMap<Arc<str>, Option<KeyValue>>| -> Option<KeyValue> {
                match overlay.get(k) {
                    Some(v) => v.clone(),
                    None => st.map.get(k).cloned(),
                }
            };
        for req in batch.iter_mut() {
            let check = req
                .ops
                .iter()
                .try_for_each(|op| compare(op, current(&op.key, &overlay).as_ref()));
            if let Err(e) = check {
                results.push(Err(e));
                continue;
            }
            rev += 1;
            let mut kvs = Vec::with_capacity(req.ops.len());
            let mut values = Vec::with_capacity(req.ops.len());
            for (op, text) in req.ops.iter_mut().zip(req.texts.iter_mut()) {
                let key: Arc<str> = Arc::from(op.key.as_str());
                let prev = current(&op.key, &overlay);
                match &mut op.action {
                    Action::Put(v) => {
                        let mut v = std::mem::replace(v, Arc::new(Value::Null));
                        stamp(Arc::make_mut(&mut v), rev);
                        let text = text.as_mut().expect("prepare() gives every put its text");
                        let raw = text.stamped(rev);
                        if let Some(sealed) = text.sealed.take() {
                            seals.insert(key.clone(), sealed);
                        }
                        let kv = KeyValue {
                            key: key.clone(),
                            raw,
                            create_rev: prev.as_ref().map(|p| p.create_rev).unwrap_or(rev),
                            mod_rev: rev,
                            hot: Some(v.clone()),
                        };
                        values.push(Some(v));
                        evs.push(Event {
                            kind: EventKind::Put,
                            kv: kv.clone(),
                            existed: prev.is_some(),
                        });
                        overlay.insert(key, Some(kv.clone()));
                        kvs.push(Some(kv));
                    }
                    Action::Delete => {
                        let p = prev.expect("checked above");
                        let kv = KeyValue { mod_rev: rev, ..p };
                        evs.push(Event {
                            kind: EventKind::Delete,
                            kv,
                            existed: true,
                        });
                        overlay.insert(key, None);
                        kvs.push(None);
                        values.push(None);
                    }
                }
            }
            results.push(Ok(TxnResult { rev, kvs, values }));
        }
        let _ = base_rev;
        drop(st);
        // 2. Persist the batch in one durable transaction.
        if rev > base_rev {
            if let Err(e) = persist(db, &overlay, &seals, rev) {
                tracing::error!(error = %e, "store commit failed");
                for (req, _) in batch.into_iter().zip(results) {
                    let _ = req.reply.send(Err(e.clone()));
                }
                return garbage;
            }
            for (k, v) in &overlay {
                match v {
                    Some(_) if is_sealed(k) => ledger.note(k, seals.remove(k).map(|s| s.1)),
                    None if is_sealed(k) => ledger.remove(k),
                    _ => {}
                }
            }
            // 3. Publish, then acknowledge. What the new versions replace is not freed
            // here (a parsed object is hundreds of allocations; freeing them under the
            // write lock stalled every reader) but handed to the reaper thread.
            state
                .write()
                .unwrap()
                .publish(overlay, evs, rev, &mut garbage);
            events.send_replace(rev);
        }
    }
    for (req, res) in batch.into_iter().zip(results) {
        let _ = req.reply.send(res);
    }
    garbage
}

fn persist(
    db: &Database,
    overlay: &HashMap<Arc<str>, Option<KeyValue>>,
    seals: &HashMap<Arc<str>, (Vec<u8>, Arc<str>)>,
    rev: Rev,
) -> Result<(), KvError> {
    let w = db.begin_write().map_err(storage)?;
    {
        let mut t = w.open_table(KV).map_err(storage)?;
        let mut buf = Vec::new();
        for (k, v) in overlay {
            match v {
                Some(kv) => {
                    encode(kv, seals.get(k).map(|s| s.0.as_slice()), &mut buf);
                    t.insert(&**k, buf.as_slice()).map_err(storage)?;
                }
                None => {
                    t.remove(&**k).map_err(storage)?;
                }
            }
        }
        let mut m = w.open_table(META).map_err(storage)?;
        m.insert("rev", rev).map_err(storage)?;
    }
    w.commit().map_err(storage)?;
    Ok(())
}
