//! Prometheus metrics of the boot listener, for the API listener's `/metrics`.
//! The metric handles are cheap clones over shared atomics: [`Metrics::register`] adds
//! them to any registry (the API's), [`Metrics::encode`] renders a standalone text page.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::BootEvent;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event: &'static str,
}

type LatencyFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs .. ~26 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

#[derive(Clone)]
pub struct Metrics {
    /// Requests by route and status code.
    pub requests: Family<RequestLabels, Counter>,
    /// Response body bytes (as declared by Content-Length) by route.
    pub bytes: Family<RouteLabels, Counter>,
    /// Time to response headers, by route.
    pub latency: LatencyFamily,
    /// Boot progress events (IPXEScriptFetched, IgnitionDataFetched).
    pub boot_progress: Family<EventLabels, Counter>,
    /// Script/Ignition requests refused by the identity check, by route.
    pub identity_refused: Family<RouteLabels, Counter>,
    /// Inventory posts by outcome (`accepted`, `forbidden`, `malformed`, `invalid`,
    /// `too_large`, `conflict`, `unknown`, `busy`).
    pub inventory: Family<ResultLabels, Counter>,
    /// Wipe reports by outcome (`bootplane_http_discovery_wipe_total`, the same results).
    pub wipe: Family<ResultLabels, Counter>,
    /// Install reports by outcome (`bootplane_http_discovery_install_total`).
    pub install: Family<ResultLabels, Counter>,
    /// Open, refused, evicted and timed-out connections ([`crate::listen::Admission`]).
    pub connections: crate::listen::ConnMetrics,
    /// Connections that ended with a protocol error or a header read timeout.
    pub connection_errors: Counter,
    /// Handles resolved once for the hot path (a family lookup hashes and locks).
    hot: std::sync::Arc<Hot>,
}

/// Pre-resolved series: per route the 200 counter, bytes and latency, plus the two
/// progress counters.
struct Hot {
    routes: Vec<(&'static str, Counter, Counter, Histogram)>,
    script_fetched: Counter,
    ignition_fetched: Counter,
}

/// The outcomes of an inventory post (`bootplane_http_discovery_inventory_total`).
pub(crate) const INVENTORY_RESULTS: [&str; 8] = [
    "accepted",
    "forbidden",
    "malformed",
    "invalid",
    "too_large",
    "conflict",
    "unknown",
    "busy",
];

/// A family with every agent-report outcome at 0.
fn results() -> Family<ResultLabels, Counter> {
    let f: Family<ResultLabels, Counter> = Family::default();
    for result in INVENTORY_RESULTS {
        let _ = f.get_or_create(&ResultLabels { result });
    }
    f
}

/// Routes whose series are resolved at start (those of the boot listener).
pub(crate) const HOT_ROUTES: [&str; 5] = ["boot_ipxe", "script", "ignition", "assets", "other"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let requests: Family<RequestLabels, Counter> = Family::default();
        let bytes: Family<RouteLabels, Counter> = Family::default();
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        let boot_progress: Family<EventLabels, Counter> = Family::default();
        let routes = HOT_ROUTES
            .iter()
            .map(|&route| {
                (
                    route,
                    requests
                        .get_or_create(&RequestLabels { route, code: 200 })
                        .clone(),
                    bytes.get_or_create(&RouteLabels { route }).clone(),
                    latency.get_or_create(&RouteLabels { route }).clone(),
                )
            })
            .collect();
        let event = |e: BootEvent| {
            let labels = EventLabels {
                event: e.condition_type(),
            };
            boot_progress.get_or_create(&labels).clone()
        };
        let hot = Hot {
            routes,
            script_fetched: event(BootEvent::IpxeScriptFetched),
            ignition_fetched: event(BootEvent::IgnitionDataFetched),
        };
        Metrics {
            requests,
            bytes,
            latency,
            boot_progress,
            identity_refused: Family::default(),
            // Every outcome exported from the start (at 0), so rates and alerts work
            // before the first discovery or cleanup.
            inventory: results(),
            wipe: results(),
            install: results(),
            connections: crate::listen::ConnMetrics::default(),
            connection_errors: Counter::default(),
            hot: std::sync::Arc::new(hot),
        }
    }

    /// Count one boot progress event (labelled by its condition type).
    pub(crate) fn progress(&self, event: BootEvent) {
        match event {
            BootEvent::IpxeScriptFetched => self.hot.script_fetched.inc(),
            BootEvent::IgnitionDataFetched => self.hot.ignition_fetched.inc(),
        };
    }

    /// Add every metric to `reg` under the `bootplane_http_` prefix.
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_http");
        r.register(
            "requests",
            "Boot HTTP requests by route and status code",
            self.requests.clone(),
        );
        r.register(
            "response_bytes",
            "Boot HTTP response body bytes by route",
            self.bytes.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time to response headers by route",
            self.latency.clone(),
        );
        r.register(
            "boot_progress",
            "Boot progress events recorded",
            self.boot_progress.clone(),
        );
        r.register(
            "identity_refused",
            "Script/Ignition requests refused by the identity check",
            self.identity_refused.clone(),
        );
        r.register(
            "discovery_inventory",
            "Discovery agents' inventory posts by outcome",
            self.inventory.clone(),
        );
        r.register(
            "discovery_wipe",
            "Cleanup agents' wipe reports by outcome",
            self.wipe.clone(),
        );
        r.register(
            "discovery_install",
            "Install agents' reports by outcome",
            self.install.clone(),
        );
        self.connections.register(r);
        r.register(
            "connection_errors",
            "Connections ended by a protocol error or header read timeout",
            self.connection_errors.clone(),
        );
    }

    /// Prometheus text exposition of these metrics alone.
    pub fn encode(&self) -> String {
        let mut reg = Registry::default();
        self.register(&mut reg);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }

    pub(crate) fn observe(&self, route: &'static str, code: u16, bytes: u64, secs: f64) {
        if let Some((_, ok, b, lat)) = self.hot.routes.iter().find(|r| r.0 == route) {
            if code == 200 {
                ok.inc();
            } else {
                self.requests
                    .get_or_create(&RequestLabels { route, code })
                    .inc();
            }
            b.inc_by(bytes);
            lat.observe(secs);
            return;
        }
        self.requests
            .get_or_create(&RequestLabels { route, code })
            .inc();
        self.bytes
            .get_or_create(&RouteLabels { route })
            .inc_by(bytes);
        self.latency
            .get_or_create(&RouteLabels { route })
            .observe(secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_prometheus_text() {
        let m = Metrics::new();
        m.observe("script", 200, 321, 0.001);
        m.boot_progress
            .get_or_create(&EventLabels {
                event: "IPXEScriptFetched",
            })
            .inc();
        let t = m.encode();
        assert!(
            t.contains("bootplane_http_requests_total{route=\"script\",code=\"200\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("bootplane_http_response_bytes_total{route=\"script\"} 321"),
            "{t}"
        );
        assert!(
            t.contains("bootplane_http_request_duration_seconds_bucket"),
            "{t}"
        );
        assert!(
            t.contains("bootplane_http_boot_progress_total{event=\"IPXEScriptFetched\"} 1"),
            "{t}"
        );
    }
}
