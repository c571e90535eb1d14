//! The store's metrics, process-wide (one store per appliance; counted where every
//! write passes, [`super::Backend`]'s transaction): `bootplane_store_txns_total{result}`
//! and `bootplane_store_txn_duration_seconds` (`bootplane_store_revision` is written by
//! the API's `/metrics` handler itself).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::backend::KvError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok`, `conflict` (a compare failed: exists, not found, modified), `error`.
    pub result: &'static str,
}

pub struct Metrics {
    pub txns: Family<ResultLabel, Counter>,
    pub txn_seconds: Histogram,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    txns: Family::default(),
    // 20 µs .. ~10 s
    txn_seconds: Histogram::new(exponential_buckets(0.000_02, 2.0, 20)),
});

/// The process's store metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    /// One transaction ended after `took`.
    pub fn observe<T>(&self, r: Result<T, &KvError>, took: Duration) {
        let result = match r {
            Ok(_) => "ok",
            Err(
                KvError::AlreadyExists { .. } | KvError::NotFound { .. } | KvError::Conflict { .. },
            ) => "conflict",
            Err(_) => "error",
        };
        self.txns.get_or_create(&ResultLabel { result }).inc();
        self.txn_seconds.observe(took.as_secs_f64());
    }

    /// Add them to `reg` under `bootplane_store_`.
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_store");
        r.register(
            "txns",
            "Store write transactions by result (ok, conflict, error)",
            self.txns.clone(),
        );
        r.register(
            "txn_duration_seconds",
            "Time a store write transaction took to commit",
            self.txn_seconds.clone(),
        );
    }
}
