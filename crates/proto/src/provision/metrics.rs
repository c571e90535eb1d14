//! The job runners' metrics, process-wide (one runner per appliance):
//! `bootplane_provision_jobs_started_total{runner}`,
//! `bootplane_provision_job_attempts_total{runner}` (local runner: each run of the
//! streamer, retries included) and `bootplane_provision_jobs_finished_total{runner,state}`
//! (local runner; a Kubernetes Job finishes in the cluster).

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunnerLabel {
    pub runner: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedLabels {
    pub runner: &'static str,
    /// `Succeeded` or `Failed`.
    pub state: &'static str,
}

#[derive(Default)]
pub struct Metrics {
    pub started: Family<RunnerLabel, Counter>,
    pub attempts: Family<RunnerLabel, Counter>,
    pub finished: Family<FinishedLabels, Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::default);

/// The process's job metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_provision");
        r.register(
            "jobs_started",
            "Provisioning jobs started, by runner",
            self.started.clone(),
        );
        r.register(
            "job_attempts",
            "Provisioning job attempts (retries included), by runner",
            self.attempts.clone(),
        );
        r.register(
            "jobs_finished",
            "Provisioning jobs finished, by runner and state (Succeeded, Failed)",
            self.finished.clone(),
        );
    }
}
