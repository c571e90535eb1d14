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
    /// Ended for falling below `min_rate_bytes_per_sec`.
    TooSlow,
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
}
