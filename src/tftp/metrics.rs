//! TFTP metrics (prometheus-client), registered into the API's registry by whoever
//! builds `/metrics`.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Kinds of errors counted by `bootplane_tftp_errors_total{kind=...}`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ErrorKind {
    /// Truncated or undecodable datagram (dropped).
    Malformed,
    /// Unknown opcode or unsupported mode (ERROR 4).
    IllegalOperation,
    /// Write request (ERROR 2).
    WriteRefused,
    /// Traversal, absolute path, outside the root (ERROR 2).
    AccessViolation,
    /// ERROR 1.
    NotFound,
    /// Bad option value (ERROR 8).
    BadOption,
    /// The client rejected our OACK or aborted with an ERROR.
    PeerError,
    /// Retries exhausted.
    Timeout,
    /// Request dropped because `max_transfers` were running.
    Busy,
    /// Request dropped because its client held `max_transfers_per_client` transfers.
    ClientBusy,
    /// Local I/O error reading a file or socket.
    Io,
    /// Packet for no transfer on the listening port (dropped).
    Unexpected,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: ErrorKind,
}

/// All TFTP server metrics.
#[derive(Debug)]
pub struct Metrics {
    pub transfers_started: Counter,
    pub transfers_completed: Counter,
    pub transfers_failed: Counter,
    pub transfers_active: Gauge,
    /// Payload bytes sent (retransmissions included).
    pub bytes_sent: Counter,
    /// DATA/OACK packets sent again after a timeout.
    pub retransmits: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    /// Seconds from request to final ACK, completed transfers only.
    pub duration_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            transfers_started: Counter::default(),
            transfers_completed: Counter::default(),
            transfers_failed: Counter::default(),
            transfers_active: Gauge::default(),
            bytes_sent: Counter::default(),
            retransmits: Counter::default(),
            errors: Family::default(),
            duration_seconds: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
        }
    }
}

impl Metrics {
    pub fn error(&self, kind: ErrorKind) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    pub fn error_count(&self, kind: ErrorKind) -> u64 {
        self.errors.get_or_create(&ErrorLabels { kind }).get()
    }

    /// Register clones of every metric under the `bootplane_tftp_` prefix.
    pub fn register(&self, reg: &mut Registry) {
        let r = reg.sub_registry_with_prefix("bootplane_tftp");
        r.register(
            "transfers_started",
            "read requests accepted",
            self.transfers_started.clone(),
        );
        r.register(
            "transfers_completed",
            "transfers whose last block was acknowledged",
            self.transfers_completed.clone(),
        );
        r.register(
            "transfers_failed",
            "transfers ended by timeout or a client error",
            self.transfers_failed.clone(),
        );
        r.register(
            "transfers_active",
            "transfers in progress",
            self.transfers_active.clone(),
        );
        r.register(
            "bytes_sent",
            "DATA payload bytes sent, retransmissions included",
            self.bytes_sent.clone(),
        );
        r.register(
            "retransmits",
            "packets retransmitted after a timeout",
            self.retransmits.clone(),
        );
        r.register("errors", "errors by kind", self.errors.clone());
        r.register(
            "transfer_duration_seconds",
            "duration of completed transfers",
            self.duration_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes() {
        let m = Metrics::default();
        m.transfers_started.inc();
        m.error(ErrorKind::NotFound);
        m.duration_seconds.observe(0.01);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
        assert!(
            s.contains("bootplane_tftp_transfers_started_total 1"),
            "{s}"
        );
        assert!(
            s.contains("bootplane_tftp_errors_total{kind=\"NotFound\"} 1"),
            "{s}"
        );
        assert!(
            s.contains("bootplane_tftp_transfer_duration_seconds_count 1"),
            "{s}"
        );
    }

    /// Every metric family the API's `/metrics` exports (TFTP, DHCP and boot HTTP, as
    /// `serve` registers them, and the API listener's connection metrics), with the sample names their type adds. (It sits here
    /// because the docs' TFTP metric names were the ones found wrong, issue 17.)
    fn exported_names() -> Vec<String> {
        // (an empty label family is not encoded at all: give each one a sample)
        let mut reg = Registry::default();
        let tftp = Metrics::default();
        tftp.error(ErrorKind::Busy);
        tftp.register(&mut reg);
        let dhcp = crate::dhcp::Metrics::default();
        dhcp.init_drop_reasons();
        let subnet = crate::dhcp::metrics::SubnetLabels {
            subnet: "10.0.0.0/24".into(),
        };
        dhcp.pool_used.get_or_create(&subnet).set(1);
        dhcp.pool_size.get_or_create(&subnet).set(2);
        dhcp.register(&mut reg);
        crate::http::Metrics::new().register(&mut reg);
        crate::listen::ConnMetrics::default()
            .register(reg.sub_registry_with_prefix("bootplane_api"));
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
        let mut names = Vec::new();
        for l in s.lines() {
            let Some(rest) = l.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = rest.split_once(' ').unwrap();
            names.push(name.to_string());
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for sfx in ["bucket", "sum", "count"] {
                        names.push(format!("{name}_{sfx}"));
                    }
                }
                _ => {}
            }
        }
        names
    }

    /// The metric names a doc mentions in `code` spans: lowercase spans starting with
    /// `bootplane_` or ending in `_*` (a prefix). `{a,b}` alternatives are expanded
    /// (`...` dropped) and a trailing `{label}` is the label set, not part of the name.
    fn mentioned(doc: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (i, span) in doc.split('`').enumerate() {
            let metric_chars =
                |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_{},.*".contains(c);
            if i % 2 == 0 || !span.chars().all(metric_chars) {
                continue;
            }
            if !(span.starts_with("bootplane_") || span.ends_with("_*")) {
                continue;
            }
            let mut names = vec![String::new()];
            let mut rest = span;
            while let Some(open) = rest.find('{') {
                let close = rest[open..].find('}').map(|c| open + c).unwrap();
                let (head, group) = (&rest[..open], &rest[open + 1..close]);
                names.iter_mut().for_each(|n| n.push_str(head));
                if group.contains(',') {
                    let alts: Vec<&str> = group.split(',').filter(|a| *a != "...").collect();
                    names = names
                        .iter()
                        .flat_map(|n| alts.iter().map(move |a| format!("{n}{a}")))
                        .collect();
                }
                rest = &rest[close + 1..];
            }
            names.iter_mut().for_each(|n| n.push_str(rest));
            out.extend(names);
        }
        out
    }

    #[test]
    fn every_metric_name_the_docs_mention_is_exported() {
        let exported = exported_names();
        let docs = [
            ("README.md", include_str!("../../README.md")),
            ("ARCHITECTURE.md", include_str!("../../ARCHITECTURE.md")),
            ("docs/tftp.md", include_str!("../../docs/tftp.md")),
            ("docs/dhcp.md", include_str!("../../docs/dhcp.md")),
            ("docs/http-boot.md", include_str!("../../docs/http-boot.md")),
        ];
        let mut checked = 0;
        for (file, doc) in docs {
            for name in mentioned(doc) {
                let found = match name.strip_suffix('*') {
                    Some(prefix) => exported.iter().any(|e| e.starts_with(prefix)),
                    None => exported.contains(&name),
                };
                assert!(
                    found,
                    "{file} names the metric `{name}`, which /metrics does not export"
                );
                checked += 1;
            }
        }
        assert!(
            checked >= 5,
            "only {checked} metric names found in the docs"
        );
        // the parser itself
        assert_eq!(
            mentioned("`bootplane_x_{a,b,...}_total{reason}` and `y_*`, not `z_q` or `Y_*`"),
            ["bootplane_x_a_total", "bootplane_x_b_total", "y_*"]
        );
    }
}
