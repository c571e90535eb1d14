//! One etcd key as the mirror keeps it ([`mirror_kv`]: opened, parsed, stamped), and
//! the values this appliance just wrote ([`OwnWrites`]), which the mirror takes as they
//! are when their watch event comes back instead of opening and parsing what it wrote.
//!
//! A committed transaction ([`super::EtcdKv::txn`]) notes each plain (not sealed) put's
//! stamped text and parsed value under its key and revision before it waits for the
//! mirror; the watch event of that key at that revision takes the entry; what no event
//! took (the event came first) the transaction removes once the mirror caught up. So
//! the cache holds at most the puts of the transactions waiting, and a value the mirror
//! takes from it is the one etcd committed at that revision (etcd's revisions are
//! unique: the same key at the same revision is the same put). Sealed values and the
//! cluster marker always go through [`mirror_kv`] (their ledger and versions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::super::backend::{KeyValue, Rev};
use super::super::kv::text::stamp;
use super::super::seal::{is_sealed, must_be_sealed, Binding, SealError, Sealing, LEGACY_SUFFIX};
use super::{marker, urev, Versions};

/// A put as committed: its revision, stamped text and parsed value.
type Put = (Rev, Arc<str>, Arc<Value>);

/// Plain puts of this appliance's transactions, by key.
#[derive(Default)]
pub(super) struct OwnWrites(Mutex<HashMap<Arc<str>, Put>>);

impl OwnWrites {
    /// Note a committed put of `kv` (stamped, with its parsed value `v`).
    pub(super) fn note(&self, kv: &KeyValue, v: &Arc<Value>) {
        if is_sealed(&kv.key) || &*kv.key == marker::KEY {
            return;
        }
        self.0
            .lock()
            .unwrap()
            .insert(kv.key.clone(), (kv.mod_rev, kv.raw.clone(), v.clone()));
    }

    /// The put of `key` at `rev`, when this appliance wrote it and it was not taken yet.
    pub(super) fn take(&self, key: &str, rev: Rev) -> Option<(Arc<str>, Arc<Value>)> {
        let mut m = self.0.lock().unwrap();
        match m.get(key) {
            Some((r, _, _)) if *r == rev => m.remove(key).map(|(_, raw, v)| (raw, v)),
            _ => None,
        }
    }

    /// Drop what is left of the puts of `keys` at `rev` (the mirror caught up without them).
    pub(super) fn forget<'a>(&self, keys: impl Iterator<Item = &'a Arc<str>>, rev: Rev) {
        let mut m = self.0.lock().unwrap();
        for k in keys {
            if m.get(k).is_some_and(|(r, _, _)| *r <= rev) {
                m.remove(k);
            }
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A watch event's put of `kv` as the mirror keeps it: taken from [`OwnWrites`] when
/// this appliance wrote it, else [`mirror_kv`] (parsed).
pub(super) fn event_kv(
    root: &str,
    kv: &etcd_client::KeyValue,
    own: &OwnWrites,
    (sealing, versions): (&Sealing, &Versions),
) -> Result<Option<KeyValue>, SealError> {
    let key = kv.key_str().ok().and_then(|k| k.strip_prefix(root));
    if let Some(key) = key {
        if let Some((raw, v)) = own.take(key, urev(kv.mod_revision())) {
            return Ok(Some(KeyValue {
                key: Arc::from(key),
                raw,
                create_rev: urev(kv.create_revision()),
                mod_rev: urev(kv.mod_revision()),
                hot: Some(v),
            }));
        }
    }
    mirror_kv(root, kv, true, sealing, versions)
}

/// One etcd key/value as the mirror keeps it: the key without the root, the value
/// opened (when sealed: noted in the ledger, see [`super::seal`]), parsed (checked:
/// etcd may hold anything) and stamped with its mod revision. `parsed`: keep the
/// parsed value next to the text (for a watch event, which controllers read next;
/// not for a listing, which would hold every object parsed). A sealed value no key
/// opens is an error (noted in the ledger under its key's name).
pub(super) fn mirror_kv(
    root: &str,
    kv: &etcd_client::KeyValue,
    parsed: bool,
    sealing: &Sealing,
    versions: &Versions,
) -> Result<Option<KeyValue>, SealError> {
    let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(root)) else {
        return Ok(None);
    };
    if key == marker::KEY {
        marker::seen(sealing, kv.value());
        return Ok(None);
    }
    let sealed = is_sealed(key);
    let held = Binding {
        create_rev: urev(kv.create_revision()),
        version: urev(kv.version()),
    };
    let opened = match sealing.sealer.open(key, kv.value(), Some(&held)) {
        Ok(o) if o.key.is_none() && must_be_sealed(key) => {
            return Err(SealError::Unsealed { key: key.into() })
        }
        Ok(o) if o.legacy && sealing.strict() => return Err(SealError::Legacy { key: key.into() }),
        Ok(o) => o,
        Err(e) => {
            if let Some(name) = e.key_name() {
                sealing.ledger.note(&Arc::from(key), Some(Arc::from(name)));
            }
            return Err(e);
        }
    };
    let mut v: Value = match serde_json::from_slice(&opened.text) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(key, error = %e, "etcd value is not JSON; ignored");
            return Ok(None);
        }
    };
    let rev = urev(kv.mod_revision());
    stamp(&mut v, rev);
    let raw = Arc::from(v.to_string());
    let key: Arc<str> = Arc::from(key);
    if sealed {
        // A legacy value counts as stale (`key1@v1`): the reseal pass binds it.
        let name = match (opened.key, opened.legacy) {
            (Some(n), true) => Some(Arc::from(format!("{n}{LEGACY_SUFFIX}"))),
            (n, _) => n,
        };
        sealing.ledger.note(&key, name);
        versions
            .lock()
            .unwrap()
            .insert(key.clone(), (rev, held.version));
    }
    Ok(Some(KeyValue {
        key,
        raw,
        create_rev: urev(kv.create_revision()),
        mod_rev: rev,
        hot: parsed.then(|| Arc::new(v)),
    }))
}

/// Whether a value that did not open is only left out of the mirror (written around
/// bootplane: replayed, or an APIToken in clear) rather than failing a listing.
pub(super) fn left_out(e: &SealError) -> bool {
    matches!(e, SealError::Replayed { .. } | SealError::Unsealed { .. }) || marker::is_legacy(e)
}

/// Log a value [`mirror_kv`] refused.
pub(super) fn refused(e: &SealError) {
    match e {
        SealError::Unsealed { .. } => tracing::error!(
            error = %e,
            "an APIToken in clear in etcd (written before tokens were sealed, or by someone who can write etcd) is not accepted: create a new token (`bootplane token create`) and delete this key from etcd"
        ),
        SealError::Legacy { .. } => tracing::error!(
            error = %e,
            "a sealed value in a legacy envelope was put back after every value was re-sealed: not served; check who can write etcd, then write the object again or delete its key from etcd"
        ),
        SealError::Replayed {
            sealed: 1, held: 1, ..
        } => tracing::warn!(
            error = %e,
            "a sealed value at version 1 is bound to another create revision: a deleted key's first value put back (not served), or another appliance's create, bound again at once"
        ),
        SealError::Replayed { .. } => tracing::error!(
            error = %e,
            "a sealed object etcd holds was rolled back to an older value: not served (this appliance keeps the value it had); check who can write etcd, then write the object again or delete its key from etcd"
        ),
        _ => {
            tracing::error!(error = %e, "a sealed object etcd holds does not open: left out of this appliance's mirror until its key is in the key file")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: Rev) -> (KeyValue, Arc<Value>) {
        let v = Arc::new(
            serde_json::json!({"metadata": {"name": key, "resourceVersion": rev.to_string()}}),
        );
        let kv = KeyValue {
            key: Arc::from(key),
            raw: Arc::from(v.to_string()),
            create_rev: rev,
            mod_rev: rev,
            hot: None,
        };
        (kv, v)
    }

    #[test]
    fn an_own_put_is_taken_once_at_its_revision_and_the_rest_forgotten() {
        let own = OwnWrites::default();
        let (a, va) = kv("/core/configmaps/default/a", 7);
        own.note(&a, &va);
        // another revision of the key (someone else's put) is not ours
        assert!(own.take("/core/configmaps/default/a", 8).is_none());
        let (raw, v) = own.take("/core/configmaps/default/a", 7).unwrap();
        assert_eq!((&*raw, &v), (&*a.raw, &va));
        assert!(
            own.take("/core/configmaps/default/a", 7).is_none(),
            "taken once"
        );
        // an event that came before the note: forgotten when the writer caught up
        let (b, vb) = kv("/core/configmaps/default/b", 9);
        own.note(&b, &vb);
        own.forget([&b.key].into_iter(), 9);
        assert_eq!(own.len(), 0);
        // a newer put of the same key by another transaction stays
        let (c, vc) = kv("/core/configmaps/default/b", 10);
        own.note(&c, &vc);
        own.forget([&b.key].into_iter(), 9);
        assert_eq!(own.len(), 1);
        // sealed keys always go through the mirror's own parsing
        let (s, vs) = kv("/core/secrets/default/s", 11);
        own.note(&s, &vs);
        assert!(own.take("/core/secrets/default/s", 11).is_none());
    }
}
