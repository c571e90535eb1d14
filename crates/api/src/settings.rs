//! The `[api]` config section: the operator-facing listener (REST API, `/metrics`,
//! `/healthz`), its TLS, its token, roles, audit log, metrics listener and its connection
//! and request limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The operator-facing listener: REST API, `/metrics`, `/healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// Bearer token. When absent, one is generated into `<state_dir>/api-token` (mode 0600).
    pub token: Option<String>,
    /// Maximum concurrent API connections. When reached, a new client still gets in:
    /// the oldest idle connection of the source holding the most is closed for it.
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold (at most
    /// `max_connections`); beyond it its own oldest idle connection makes room, or
    /// (none idle) the new one is refused.
    pub max_connections_per_source: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout_ms: u64,
    /// How long a connection may wait for a request's first byte, after the accept and
    /// between keep-alive requests (a watch in progress is not idle).
    pub idle_timeout_ms: u64,
    /// A request body must be complete within this long of its head (408 after it).
    pub body_read_timeout_ms: u64,
    /// Watches one identity (token name, certificate CN) may hold open at once, over
    /// all its connections (429 beyond).
    pub max_watches_per_user: usize,
    /// Watches one connection may hold open at once (HTTP/2 multiplexes them; 429
    /// beyond).
    pub max_watches_per_connection: usize,
    /// Concurrent streams (requests) one HTTP/2 connection may carry, advertised in
    /// its SETTINGS.
    pub http2_max_concurrent_streams: u32,
    /// Maximum request body size in bytes (413 beyond it, before the body is read;
    /// YAML aliases may not expand a body by more than this either).
    pub max_body_bytes: usize,
    /// TLS on the listener (the default). `false` serves plain HTTP and is refused
    /// unless `listen` is a loopback address.
    pub tls: bool,
    /// Server certificate chain (PEM) to present instead of the generated one; with
    /// `key_file`. Re-read when it changes.
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// CA bundle (PEM) client certificates must chain to (default: the generated CA,
    /// `<state_dir>/tls/ca.crt`). Read at start.
    pub client_ca_file: Option<PathBuf>,
    /// Extra names (DNS names or IP addresses) for the generated server certificate,
    /// besides localhost, 127.0.0.1, ::1, the hostname and the listen address.
    pub tls_names: Vec<String>,
    /// The audit log (default `<state_dir>/audit.log`).
    pub audit_log: Option<PathBuf>,
    /// The audit log is rotated when it would grow past this.
    pub audit_max_bytes: u64,
    /// Rotated audit logs kept (`audit.log.1` … `.N`).
    pub audit_keep: usize,
    /// Unauthenticated requests (401) are summed per source over this long and written
    /// as one audit line per source with a `count`.
    pub audit_unauthenticated_interval_ms: u64,
    /// A separate plain-HTTP listener serving only `/metrics`, without authentication
    /// (loopback or a monitoring network). Unset: `/metrics` is on the API listener,
    /// for the `metrics` role (and `admin`, `operator`).
    pub metrics_listen: Option<SocketAddr>,
    /// Custom roles (`[[api.roles]]`), beside the built-in ones (`api::auth`). Last:
    /// TOML writes tables after plain values.
    pub roles: Vec<super::authz::RoleConfig>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:9090".parse().unwrap(),
            token: None,
            max_connections: 512,
            max_connections_per_source: 128,
            header_read_timeout_ms: 5_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 30_000,
            // Twice a source's connection share: a controller or dashboard never needs
            // as many; a runaway client stops long before the runtime feels it.
            max_watches_per_user: 256,
            max_watches_per_connection: 16,
            http2_max_concurrent_streams: 64,
            // Kubernetes' limit; a stored object is at most 1.5 MiB anyway.
            max_body_bytes: 3 << 20,
            tls: true,
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            tls_names: Vec::new(),
            audit_log: None,
            audit_max_bytes: 100 << 20,
            audit_keep: 5,
            audit_unauthenticated_interval_ms: 10_000,
            metrics_listen: None,
            roles: Vec::new(),
        }
    }
}

impl ApiConfig {
    /// Semantic checks that TOML typing cannot express.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = &self.token {
            if t.len() < 16 {
                bail!("api.token must be at least 16 characters");
            }
        }
        let (max, per) = (self.max_connections, self.max_connections_per_source);
        if max == 0 || per == 0 {
            bail!("api.max_connections and api.max_connections_per_source must be at least 1 (got {max} and {per})");
        }
        if !self.tls && !self.listen.ip().is_loopback() {
            bail!(
                "api.tls = false serves the API as plain HTTP, which is allowed only on a loopback address, but api.listen is {}: set api.listen to 127.0.0.1 or ::1, or keep api.tls = true",
                self.listen
            );
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("api.cert_file and api.key_file go together: set both or neither");
        }
        for n in &self.tls_names {
            let ok = n.parse::<std::net::IpAddr>().is_ok()
                || (!n.is_empty()
                    && n.len() <= 253
                    && n.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
                    }));
            if !ok {
                bail!("api.tls_names: {n:?} is neither a DNS name nor an IP address");
            }
        }
        for (key, ms) in [
            ("api.header_read_timeout_ms", self.header_read_timeout_ms),
            ("api.idle_timeout_ms", self.idle_timeout_ms),
            ("api.body_read_timeout_ms", self.body_read_timeout_ms),
            (
                "api.audit_unauthenticated_interval_ms",
                self.audit_unauthenticated_interval_ms,
            ),
            ("api.max_watches_per_user", self.max_watches_per_user as u64),
            (
                "api.max_watches_per_connection",
                self.max_watches_per_connection as u64,
            ),
            (
                "api.http2_max_concurrent_streams",
                u64::from(self.http2_max_concurrent_streams),
            ),
        ] {
            if ms == 0 {
                bail!("{key} must be at least 1");
            }
        }
        if self.audit_max_bytes < 4096 {
            bail!(
                "api.audit_max_bytes must be at least 4096 (got {})",
                self.audit_max_bytes
            );
        }
        if self.audit_keep > 1000 {
            bail!(
                "api.audit_keep must be at most 1000 (got {})",
                self.audit_keep
            );
        }
        super::authz::Roles::new(&self.roles).map_err(|e| anyhow::anyhow!("api.roles: {e}"))?;
        Ok(())
    }

    /// The listener's connection admission limits.
    /// The TLS keys of `[api]`, as [`crate::tls::setup`] takes them.
    pub fn tls_settings(&self) -> crate::tls::Settings {
        crate::tls::Settings {
            enabled: self.tls,
            listen: self.listen,
            names: self.tls_names.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
        }
    }

    pub fn limits(&self) -> crate::listen::Limits {
        crate::listen::Limits {
            max_connections: self.max_connections,
            max_per_source: self.max_connections_per_source,
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms.max(100)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(100)),
        }
        .normalized()
    }
}
