//! The reconcilers' metrics, process-wide (one appliance per process; every controller
//! set, metal, provisioning, BMC and discovery, runs on [`super::Runtime`]):
//! `bootplane_controller_reconciles_total{controller,result}` and
//! `bootplane_controller_reconcile_duration_seconds{controller}`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: &'static str,
    /// `done`, `requeue` (asked to run again later), `conflict`, `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: &'static str,
}

type Durations = Family<ControllerLabel, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    // 100 µs .. ~52 s
    Histogram::new(exponential_buckets(0.000_1, 2.0, 20))
}

pub struct Metrics {
    pub reconciles: Family<ResultLabels, Counter>,
    pub durations: Durations,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    reconciles: Family::default(),
    durations: Family::new_with_constructor(histogram),
});

/// The process's controller metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    /// One reconcile of `controller` took `took` and ended with `result`.
    pub fn observe(&self, controller: &'static str, result: &'static str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabels { controller, result })
            .inc();
        self.durations
            .get_or_create(&ControllerLabel { controller })
            .observe(took.as_secs_f64());
    }

    /// Add both families to `reg` under `bootplane_controller_`.
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_controller");
        r.register(
            "reconciles",
            "Reconciles by controller and result (done, requeue, conflict, error)",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time one reconcile took, by controller",
            self.durations.clone(),
        );
    }
}
