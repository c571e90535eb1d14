//! `bootplane_power_requests_total{driver,action,outcome}`: every power request the
//! controllers make, whichever driver acts on the Server ([`Metered`] wraps the
//! driver the controllers are given).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::{Outcome, Power, PowerDriver};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub driver: &'static str,
    /// `on`, `off`, `reset`.
    pub action: &'static str,
    /// `done`, `pending`, `retrying`, `error`.
    pub outcome: &'static str,
}

#[derive(Clone, Default)]
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
}

impl Metrics {
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "bootplane_power_requests",
            "Power requests by driver, action (on, off, reset) and outcome (done, pending, retrying, error)",
            self.requests.clone(),
        );
    }
}

/// A driver that counts what it is asked and how it answered.
pub struct Metered {
    pub inner: Arc<dyn PowerDriver>,
    pub metrics: Metrics,
}

impl Metered {
    fn count(&self, server: &Value, action: &'static str, r: &anyhow::Result<Outcome>) {
        let outcome = match r {
            Ok(Outcome::Done) => "done",
            Ok(Outcome::Pending(_)) => "pending",
            Ok(Outcome::Retrying(..)) => "retrying",
            Err(_) => "error",
        };
        let driver = self.inner.name_for(server);
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                driver,
                action,
                outcome,
            })
            .inc();
    }
}

impl PowerDriver for Metered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn name_for(&self, server: &Value) -> &'static str {
        self.inner.name_for(server)
    }
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome> {
        let r = self.inner.set_power(server, want);
        let action = match want {
            Power::On => "on",
            Power::Off => "off",
        };
        self.count(server, action, &r);
        r
    }
    fn reset(&self, server: &Value) -> anyhow::Result<Outcome> {
        let r = self.inner.reset(server);
        self.count(server, "reset", &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_driver_action_outcome() {
        let m = Metrics::default();
        let d = Metered {
            inner: Arc::new(super::super::Instant),
            metrics: m.clone(),
        };
        let s = serde_json::json!({"metadata": {"name": "s1"}});
        d.set_power(&s, Power::On).unwrap();
        assert!(d.reset(&s).is_err());
        let get = |action, outcome| {
            m.requests
                .get_or_create(&RequestLabels {
                    driver: "test",
                    action,
                    outcome,
                })
                .get()
        };
        assert_eq!(get("on", "done"), 1);
        assert_eq!(get("reset", "error"), 1);
    }
}
