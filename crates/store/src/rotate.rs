//! Key rotation for secrets at rest, in the background: the key file is read again on
//! SIGHUP (a bump of the `reload` generation the caller hands in) or when it changes (checked every [`CHECK`]); every Secret and BMCSecret
//! stored under another key than its first is rewritten ([`super::Store::reseal`]),
//! at most [`PER_PASS`] per pass; `bootplane_store_secrets_by_key{key}` counts the
//! objects under each key, and one log line says when none is left under an older
//! key, so it can be removed from the file. On etcd the same pass binds legacy sealed
//! values and then writes the cluster's sealing marker
//! ([`super::etcd::marker`]), after which legacy values are refused.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::backend::KvBackend;
use super::Store;

/// How often the key file's change time is checked and a pass runs.
pub(crate) const CHECK: Duration = Duration::from_secs(1);
/// Most objects rewritten per pass: the rate rotation adds to the store's writes.
pub(crate) const PER_PASS: usize = 50;

/// Label of [`Metrics::by_key`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabel {
    pub key: String,
}

/// `bootplane_store_secrets_by_key{key}`: Secrets, BMCSecrets and APITokens stored
/// under each key (`identity`: in clear, written before encryption existed;
/// `KEY@v1`: on etcd, in the envelope of before the version binding).
#[derive(Clone, Default)]
pub struct Metrics {
    pub by_key: Family<KeyLabel, Gauge>,
}

impl Metrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "bootplane_store_secrets_by_key",
            "Secrets, BMCSecrets and APITokens stored under each encryption key (identity: in clear; KEY@v1: the older envelope)",
            self.by_key.clone(),
        );
    }

    /// Set each key's count; keys counted before and no longer seen go to 0.
    fn set(&self, store: &Store, shown: &mut BTreeSet<String>) {
        let sealing = store.kv().sealing();
        let counts = sealing.ledger.counts();
        for name in sealing.sealer.key_names() {
            shown.insert(name.to_string());
        }
        shown.extend(counts.keys().cloned());
        for k in shown.iter() {
            let n = counts.get(k).copied().unwrap_or(0);
            self.by_key
                .get_or_create(&KeyLabel { key: k.clone() })
                .set(n as i64);
        }
    }
}

/// Run until `stop` resolves; the key file is read again at once each time `reload`
/// changes (SIGHUP).
pub async fn run(
    store: Store,
    metrics: Metrics,
    stop: impl Future<Output = ()>,
    mut reload: tokio::sync::watch::Receiver<u64>,
) {
    let sealer = store.kv().sealing().sealer.clone();
    let mut shown = BTreeSet::new();
    // Objects were left under an older key at the last pass (so "none left" is said once).
    let mut pending = false;
    tokio::pin!(stop);
    loop {
        let forced = tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(CHECK) => false,
            Ok(()) = reload.changed() => true,
        };
        // A stat each second and a read on change: file I/O, so off the async workers.
        let s = sealer.clone();
        let reloaded = tokio::task::spawn_blocking(move || s.reload(forced))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("reading the key file: {e}")));
        match reloaded {
            Ok(true) => tracing::info!(
                path = %sealer.path().display(),
                keys = ?sealer.key_names(),
                "encryption key file read again; new writes use key {}",
                sealer.primary()
            ),
            Ok(false) => {}
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                "encryption key file not read again; the keys stay as they were"
            ),
        }
        metrics.set(&store, &mut shown);
        let primary = sealer.primary();
        let stale: usize = store
            .kv()
            .sealing()
            .ledger
            .counts()
            .iter()
            .filter(|(k, _)| **k != *primary)
            .map(|(_, n)| n)
            .sum();
        if stale == 0 {
            #[cfg(feature = "etcd")]
            if let super::Backend::Etcd(kv) = store.kv() {
                // No legacy value left: the cluster's sealing marker ends them.
                if let Err(e) = kv.settle_sealing().await {
                    tracing::warn!(error = %e, "writing the cluster's sealing marker failed; retrying later");
                }
            }
            if pending && sealer.is_cluster() {
                tracing::info!(
                    key = %primary,
                    "every Secret and BMCSecret is encrypted with key {primary}: once every appliance says so, `bootplane store rotate --drop-old` removes the older keys from the cluster's keyring"
                );
                pending = false;
            } else if pending {
                tracing::info!(
                    key = %primary,
                    "every Secret and BMCSecret is encrypted with key {primary}: the older keys may be removed from the key file"
                );
                pending = false;
            }
            continue;
        }
        if !pending {
            tracing::info!(stale, key = %primary, "re-encrypting Secrets and BMCSecrets stored under older keys");
            pending = true;
        }
        match store.reseal(PER_PASS).await {
            Ok(r) if r.rewritten > 0 => {
                tracing::debug!(rewritten = r.rewritten, skipped = r.skipped, "re-encrypted")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "re-encrypting secrets failed; retrying later"),
        }
        metrics.set(&store, &mut shown);
    }
}
