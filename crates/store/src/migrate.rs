//! `bootplane store migrate`: copy every object from one engine into the other
//! (embedded redb ↔ etcd), as stored. Objects keep their text, `uid`s and timestamps;
//! `resourceVersion`s become the destination's revisions (clients re-list, as after
//! any restore). The destination must hold no object: a migration never merges.

use anyhow::{bail, Context, Result};

use super::backend::{KvBackend, Op};
use super::kv::Compare;
use super::Store;

/// Objects per transaction (under etcd's default `--max-txn-ops` of 128).
const CHUNK: usize = 100;

/// Copy every object of `from` into `to`, which must be empty; the number copied.
pub async fn migrate(from: &Store, to: &Store) -> Result<usize> {
    let (dest, _) = to.kv().range("/");
    if !dest.is_empty() {
        bail!(
            "the destination already holds {} objects (first: {}); a migration never merges: empty it first",
            dest.len(),
            dest[0].key
        );
    }
    let (all, rev) = from.kv().range("/");
    tracing::info!(objects = all.len(), rev, "copying the store");
    let mut copied = 0;
    for chunk in all.chunks(CHUNK) {
        let ops = chunk
            .iter()
            .map(|kv| Op::put(kv.key.to_string(), Compare::Absent, (*kv.value()).clone()))
            .collect();
        to.kv()
            .txn(ops)
            .await
            .with_context(|| format!("writing objects from {}", chunk[0].key))?;
        copied += chunk.len();
    }
    let (check, _) = to.kv().range("/");
    if check.len() != all.len() {
        bail!(
            "copied {} objects but the destination shows {}",
            all.len(),
            check.len()
        );
    }
    Ok(copied)
}
