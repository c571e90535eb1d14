//! The cluster's sealing marker: the end of the legacy envelopes on etcd.
//!
//! Values sealed by appliances of before the exact binding (`v1`, bound to the store
//! key only, and `v2` bound to create revision 0) would open again if put back, so
//! they are accepted only until every one was re-sealed once. Then any appliance
//! writes the marker (`{prefix}objects/bootplane.dev/sealing`, the text
//! [`TEXT`] sealed with the primary key, so that it cannot be written without the key
//! file): every mirror that lists or watches it refuses legacy values from then on
//! ([`super::super::seal::SealError::Legacy`]). The migration is the key-rotation
//! pass ([`crate::rotate`]) on every appliance: each rewrite is a compare-and-
//! swap and the marker's put is idempotent, so appliances racing need no lock.
//!
//! The marker is kept out of the mirror (it is not an object). It is sealed again with
//! the primary key after a rotation (so removing an old key does not lose it). Once
//! seen, a deleted marker leaves this appliance strict (an error says so) and the
//! next pass writes it again. Limit: an appliance that starts while the marker is
//! gone (deleted by someone who can write etcd) accepts legacy values put back until
//! its first pass re-seals them and writes the marker again.

use std::sync::Arc;

use super::super::seal::{SealError, Sealing};

/// The marker's store key (under the objects root; no resource type maps to it).
pub(crate) const KEY: &str = "/bootplane.dev/sealing";
/// The marker's plain text.
pub(crate) const TEXT: &[u8] = b"legacy envelopes refused";

/// A put of the marker seen (listing or watch): strict when it opens.
pub(super) fn seen(sealing: &Sealing, value: &[u8]) {
    match sealing.sealer.open(KEY, value, None) {
        Ok(o) if o.key.is_some() && &*o.text == TEXT => {
            let name = o.key.expect("sealed");
            if !sealing.strict() {
                tracing::info!(key = %name, "the cluster's sealing marker is there: legacy sealed values are refused");
            }
            sealing.set_marker(name);
        }
        Ok(_) => tracing::error!(
            "the cluster's sealing marker in etcd is not one bootplane wrote (not sealed with a key of the key file): ignored"
        ),
        Err(e) => tracing::error!(error = %e, "the cluster's sealing marker does not open: ignored"),
    }
}

/// The marker deleted (not by bootplane): strict stays if it was, and [`due`] says to
/// write it again (it names no key now).
pub(super) fn deleted(sealing: &Sealing) {
    if sealing.strict() {
        sealing.set_marker(Arc::from(""));
    }
    tracing::error!(
        strict = sealing.strict(),
        "the cluster's sealing marker was deleted from etcd (bootplane never deletes it): this appliance keeps refusing legacy sealed values, and writes it again; check who can write etcd"
    );
}

/// Whether the marker must be written now: none yet and no legacy value left, or it
/// is sealed with another key than the primary.
pub(super) fn due(sealing: &Sealing) -> bool {
    let primary: Arc<str> = sealing.sealer.primary();
    match sealing.marker() {
        Some(name) => *name != *primary,
        None => !sealing.ledger.has_legacy(),
    }
}

/// The marker's stored bytes, sealed with the primary key.
pub(super) fn value(sealing: &Sealing) -> (Vec<u8>, Arc<str>) {
    sealing.sealer.seal(KEY, None, TEXT)
}

/// Whether a value that did not open is a legacy one refused after the marker.
pub(super) fn is_legacy(e: &SealError) -> bool {
    matches!(e, SealError::Legacy { .. })
}
