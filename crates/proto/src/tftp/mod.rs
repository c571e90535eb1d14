//! TFTP server (RFC 1350/2347/2348/2349/7440) for firmware fetching iPXE: read
//! requests only, octet and netascii, `blksize`/`tsize`/`timeout`/`windowsize`.
//!
//! Layout: [`packet`] (wire format), [`transfer`] (pure negotiation and the
//! `event + state -> step` transfer machine), [`files`] (path sanitising, MAC-prefix
//! fallback, in-memory file cache, large files read as sent), [`server`] (the listener: parses
//! requests, prepares transfers), `engine` (threads with an epoll loop each that drive
//! the transfers), [`metrics`].
//!
//! Why not the `async-tftp` crate (0.4, which does implement blksize/tsize/timeout/
//! windowsize): it is built on smol's `async-io`/`blocking` rather than tokio, reads
//! each block from an `AsyncRead` handle into a per-transfer buffer (a copy per packet
//! and a file handle per transfer), has no single-port mode, no exponential backoff,
//! no transfer limit and no metrics hooks, and its handler trait cannot share one
//! cached/mapped file among a thousand concurrent transfers. The goals here (3x
//! tftpd-hpa on one large file, a 1,000-client storm in under 64 MiB) are met by
//! sending a whole window with one `sendmmsg` whose iovecs point into the shared
//! file bytes (files above `small_file_max_bytes`: into one `pread` of the window, as
//! a mapping can fault the process when the file is truncated, see [`files`]), so the
//! engine is written here; it is small and fully unit-tested.

mod engine;
pub mod files;
pub mod metrics;
pub mod packet;
pub mod server;
pub mod transfer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::ensure;
use serde::{Deserialize, Serialize};

use crate::shutdown::Shutdown;

pub use metrics::Metrics;
pub use server::Server;

/// The `[tftp]` config section (TFTP is disabled unless `enabled` or `--tftp-listen`
/// is given).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TftpConfig {
    pub enabled: bool,
    pub listen: SocketAddr,
    /// Directory served (the iPXE assets by default).
    pub root: PathBuf,
    /// Concurrent transfers; further requests are dropped (clients retransmit).
    pub max_transfers: usize,
    /// Concurrent transfers one client may hold (by IPv4 address or IPv6 /64), so a
    /// flood of stalled transfers from one source leaves slots for the others;
    /// 0 = half of `max_transfers`.
    pub max_transfers_per_client: usize,
    /// Largest blksize granted (also capped by the path MTU to the client).
    pub max_blksize: u16,
    /// Largest windowsize granted (RFC 7440).
    pub max_windowsize: u16,
    /// Serve every transfer from the listening port (for NAT/firewalls) instead of
    /// a per-transfer ephemeral port.
    pub single_port: bool,
    /// Engine threads driving the transfers; 0 = one per core.
    pub workers: usize,
    /// Retransmission timeout before the first RTT sample, when the client sends no
    /// `timeout` option. Afterwards the timeout follows the measured RTT
    /// (srtt + 4 rttvar) between `retransmit_min_ms` and `retransmit_max_ms`.
    pub retransmit_initial_ms: u64,
    pub retransmit_min_ms: u64,
    /// Cap of the exponential retransmission backoff.
    pub retransmit_max_ms: u64,
    /// Consecutive timeouts before a transfer is abandoned.
    pub max_retries: u32,
    /// Largest `timeout` option (RFC 2349, seconds) accepted. A larger one is declined
    /// (left out of the OACK; the RFC has the server echo the client's value or
    /// nothing) and the transfer keeps the server's own retransmission timeouts.
    pub max_timeout_secs: u64,
    /// Smallest average rate, in acknowledged bytes a second, a transfer must keep once
    /// older than 10 s (which count in its allowance); below it the transfer is ended
    /// with an ERROR, so a client acknowledging a tiny block just before each timeout
    /// cannot hold a slot for days. 0 = no minimum.
    pub min_rate_bytes_per_sec: u64,
    /// Files up to this size are served from memory; larger ones are read (`pread`) as sent.
    pub small_file_max_bytes: u64,
    /// Total bytes of small files kept in memory.
    pub cache_max_bytes: u64,
    /// Largest file served in netascii mode (converted in memory once per version of
    /// the file and shared by its transfers; counted in `cache_max_bytes` when kept).
    pub netascii_max_bytes: u64,
    /// Receive buffer asked for the listening socket (capped by the kernel's
    /// `net.core.rmem_max`), so a burst of read requests after a power cut is queued
    /// rather than dropped; 0 = keep the kernel default (`net.core.rmem_default`).
    pub listen_rcvbuf_bytes: usize,
}

impl Default for TftpConfig {
    fn default() -> Self {
        TftpConfig {
            enabled: false,
            listen: SocketAddr::from(([0, 0, 0, 0], 69)),
            root: PathBuf::from("ipxe"),
            max_transfers: 2048,
            max_transfers_per_client: 0,
            max_blksize: 65464,
            max_windowsize: 64,
            single_port: false,
            workers: 0,
            retransmit_initial_ms: 250,
            retransmit_min_ms: 20,
            retransmit_max_ms: 4000,
            max_retries: 6,
            max_timeout_secs: 5,
            min_rate_bytes_per_sec: 512,
            small_file_max_bytes: 4 << 20,
            cache_max_bytes: 32 << 20,
            netascii_max_bytes: 16 << 20,
            listen_rcvbuf_bytes: server::LISTEN_RCVBUF,
        }
    }
}

impl TftpConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.listen_rcvbuf_bytes <= 1 << 30,
            "tftp.listen_rcvbuf_bytes must be at most 1 GiB"
        );
        ensure!(
            self.max_transfers >= 1,
            "tftp.max_transfers must be at least 1"
        );
        ensure!(
            (8..=65464).contains(&self.max_blksize),
            "tftp.max_blksize must be within 8..=65464"
        );
        ensure!(
            (1..=255).contains(&self.max_timeout_secs),
            "tftp.max_timeout_secs must be within 1..=255"
        );
        ensure!(
            self.max_windowsize >= 1,
            "tftp.max_windowsize must be at least 1"
        );
        ensure!(
            self.retransmit_min_ms >= 1,
            "tftp.retransmit_min_ms must be at least 1"
        );
        ensure!(
            self.retransmit_initial_ms >= self.retransmit_min_ms,
            "tftp.retransmit_initial_ms must be at least retransmit_min_ms"
        );
        ensure!(
            self.retransmit_max_ms >= self.retransmit_initial_ms,
            "tftp.retransmit_max_ms must be at least retransmit_initial_ms"
        );
        Ok(())
    }

    /// Transfers one client may hold at once (`max_transfers_per_client`, 0 = half).
    pub(crate) fn per_client_cap(&self) -> usize {
        match self.max_transfers_per_client {
            0 => (self.max_transfers / 2).max(1),
            n => n.min(self.max_transfers),
        }
    }
}

/// Bind the `[tftp]` listener and serve until shutdown, counting into `metrics` (the
/// ones the API's `/metrics` shows).
pub async fn run(
    config: &TftpConfig,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let server = Server::bind(config, metrics).await?;
    tracing::info!(listen = %server.local_addr()?, root = %config.root.display(), "tftp server listening");
    server.run(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::TftpConfig;

    fn section(text: &str) -> Result<TftpConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn section_parses_and_rejects_unknown() {
        let c =
            section("enabled = true\nmax_transfers = 10\nsingle_port = true\nmax_windowsize = 8\n")
                .unwrap();
        assert_eq!(
            (c.max_transfers, c.single_port, c.max_windowsize),
            (10, true, 8)
        );
        let e = section("max_transfer = 10\n").unwrap_err().to_string();
        assert!(e.contains("max_transfer"), "{e}");
        let c = section("max_blksize = 4\n").unwrap();
        assert!(c.validate().is_err());
        let c = section("max_timeout_secs = 0\n").unwrap();
        assert!(c.validate().is_err());
        let c = section("max_transfers = 10\n").unwrap();
        assert_eq!(c.per_client_cap(), 5);
        let c = section("max_transfers = 10\nmax_transfers_per_client = 99\n").unwrap();
        assert_eq!(c.per_client_cap(), 10);
        TftpConfig::default().validate().unwrap();
    }
}
