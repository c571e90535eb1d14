//! The boot listener's config sections: `[http]` ([`HttpConfig`]: the listener, its
//! limits and what it answers unknown machines) and `[boot]` ([`BootConfig`]: the
//! template and image directories the boot side renders and serves from). `config`
//! aggregates them into the whole file; [`super::BootHttp::from_config`] and
//! [`Limits::from_config`] turn them into the running listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The machine-facing HTTP boot listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// URL machines use to reach this listener (e.g. `http://10.0.0.1:8080`); when
    /// absent it is derived from the listen address.
    pub public_url: Option<String>,
    /// Root of `/assets/` (iPXE binaries, image files).
    pub assets_dir: PathBuf,
    /// Connections open at once. When reached, a new client still gets in: the oldest
    /// idle connection of the source holding the most is closed for it.
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold; beyond it its own
    /// oldest idle connection makes room, or (none idle) the new one is refused.
    pub max_connections_per_source: usize,
    /// Request head limit (431 beyond it); at least 8192.
    pub max_header_bytes: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout_ms: u64,
    /// How long a connection may wait for a request's first byte, after the accept and
    /// between keep-alive requests (default 30 s; nginx waits 60 s).
    pub idle_timeout_ms: u64,
    /// A response sent at a lower average rate than this, counted after its first
    /// `send_rate_grace_ms` (which the average includes as an allowance), is ended;
    /// 0 = off. The default, 4 KiB/s (32 kbit/s), is below what any firmware gets even
    /// with every slot busy on a 1 Gbit/s link (~30 KiB/s each).
    pub min_send_rate_bytes_per_sec: u64,
    /// When the listener (or a source's share) is full and no connection is idle, a
    /// response below this average rate after the grace may be closed for the new
    /// client (the slowest first, from the source holding most); 0 = only idle
    /// connections are evicted. Holding all 4,096 slots against the default 64 KiB/s
    /// takes reading ~2 Gbit/s.
    pub slow_send_rate_bytes_per_sec: u64,
    /// How long a response runs before the two rates above apply (default 10 s, as
    /// TFTP's `min_rate_bytes_per_sec`).
    pub send_rate_grace_ms: u64,
    /// Threads serving the listener, each with its own runtime and `SO_REUSEPORT`
    /// socket on `listen` (as nginx's worker processes); 0 (default) = one per core.
    pub workers: usize,
    /// Script for unknown / unclaimed / failed machines: `exit` (local disk), `retry`
    /// (sleep `retry_secs`, chain `/boot.ipxe` again) or `discovery` (boot `discovery_image`).
    pub unknown_action: String,
    pub retry_secs: u32,
    /// Image catalog reference booted by `unknown_action = "discovery"`.
    pub discovery_image: Option<String>,
    /// Console arguments appended to every kernel command line.
    pub console: String,
    /// Lifetime of the signed per-boot URLs minted into scripts (a rendered script, and so
    /// its token, is reused for at most half of this). Default 600 (10 minutes).
    pub token_ttl_secs: u64,
    /// Put a signed per-boot token into each script's Ignition URL and require it on
    /// every Ignition fetch, and a script token on every request for a claimed (or
    /// discovering) machine's script, whatever the source address (default true); the
    /// DHCP reply to a known machine's iPXE carries its script URL with that token.
    /// Off: script and Ignition are served to the machine's registered addresses only,
    /// without a token.
    pub sign_ignition_urls: bool,
    /// Serve each machine's Ignition once per boot: a second fetch is refused until the
    /// power driver powers the machine off or resets it, or its boot configuration
    /// changes (default false).
    pub ignition_once: bool,
    /// HMAC key file for per-boot tokens; default `<state_dir>/http-token-key` (created, 0600).
    pub token_key_file: Option<PathBuf>,
    /// How file data reaches the socket: `sendfile` (default), `mmap` or `read`.
    pub file_io: String,
    /// Memory budget for file data in flight across all downloads: each download's chunk
    /// is this divided by the number of downloads, clamped to 8 KiB..1 MiB.
    pub stream_budget_bytes: usize,
    /// `[http.boot_iso]`: the files the boot ISO is built from.
    pub boot_iso: BootIsoConfig,
}

/// `[http.boot_iso]`: the third-party files inside the boot ISO that `/boot.iso` and
/// `/ipxe/boot.iso` serve (see [`super::bootiso`]). Defaults are Debian's paths; a
/// missing file is a warning at start-up and a 503 naming it when an ISO is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BootIsoConfig {
    /// ISOLINUX's El Torito boot file (Debian `isolinux`).
    pub isolinux_bin: PathBuf,
    /// ISOLINUX's core module, loaded by `isolinux.bin` (Debian `syslinux-common`).
    pub ldlinux_c32: PathBuf,
    /// iPXE as a Linux kernel; it runs the chain script it is given as initrd (Debian `ipxe`).
    pub ipxe_lkrn: PathBuf,
    /// iPXE for UEFI, the ISO's UEFI boot entry (`EFI/BOOT/BOOTX64.EFI` in its ESP image).
    pub ipxe_efi: PathBuf,
}

impl Default for BootIsoConfig {
    fn default() -> Self {
        BootIsoConfig {
            isolinux_bin: PathBuf::from("/usr/lib/ISOLINUX/isolinux.bin"),
            ldlinux_c32: PathBuf::from("/usr/lib/syslinux/modules/bios/ldlinux.c32"),
            ipxe_lkrn: PathBuf::from("/usr/lib/ipxe/ipxe.lkrn"),
            ipxe_efi: PathBuf::from("/usr/lib/ipxe/ipxe.efi"),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "0.0.0.0:8080".parse().unwrap(),
            public_url: None,
            assets_dir: PathBuf::from("ipxe"),
            max_connections: 4096,
            max_connections_per_source: 512,
            max_header_bytes: 16 << 10,
            header_read_timeout_ms: 5_000,
            idle_timeout_ms: 30_000,
            min_send_rate_bytes_per_sec: 4 << 10,
            slow_send_rate_bytes_per_sec: 64 << 10,
            send_rate_grace_ms: 10_000,
            workers: 0,
            unknown_action: "exit".into(),
            retry_secs: 10,
            discovery_image: None,
            console: "console=tty0 console=ttyS0,115200".into(),
            token_ttl_secs: 600,
            sign_ignition_urls: true,
            ignition_once: false,
            token_key_file: None,
            file_io: "sendfile".into(),
            stream_budget_bytes: 8 << 20,
            boot_iso: BootIsoConfig::default(),
        }
    }
}

impl HttpConfig {
    /// Semantic checks that TOML typing cannot express.
    pub fn validate(&self) -> Result<()> {
        if let Some(u) = &self.public_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("http.public_url must start with http:// or https:// (got {u:?})");
            }
        }
        let (max, per) = (self.max_connections, self.max_connections_per_source);
        if max == 0 || per == 0 {
            bail!("http.max_connections and http.max_connections_per_source must be at least 1 (got {max} and {per})");
        }
        for (key, ms) in [
            ("http.header_read_timeout_ms", self.header_read_timeout_ms),
            ("http.idle_timeout_ms", self.idle_timeout_ms),
            ("http.send_rate_grace_ms", self.send_rate_grace_ms),
        ] {
            if ms == 0 {
                bail!("{key} must be at least 1");
            }
        }
        Ok(())
    }

    /// `public_url` as machines should get it, decided at start-up: the configured one;
    /// else, with `listen` on an unspecified address, `http://<dhcp_addr>:<port>` when
    /// the DHCP interface's address is known (machines reach the appliance there);
    /// else the derived loopback URL with a warning to log: only this host reaches it.
    pub fn reachable_url(&self, dhcp_addr: Option<std::net::Ipv4Addr>) -> Reachable {
        let listen_loopback = self.listen.ip().is_loopback();
        if let Some(u) = &self.public_url {
            let host = u
                .split_once("://")
                .map(|(_, r)| r)
                .unwrap_or(u)
                .split(['/', ':'])
                .next()
                .unwrap_or("");
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            return Reachable {
                public_url: None,
                warning: (loopback && !listen_loopback).then(|| {
                    format!("http.public_url {u} is a loopback address but http.listen is {}: machines cannot reach it; set http.public_url to the address machines reach", self.listen)
                }),
            };
        }
        if !self.listen.ip().is_unspecified() {
            return Reachable::default();
        }
        match dhcp_addr {
            Some(ip) => Reachable {
                public_url: Some(format!("http://{ip}:{}", self.listen.port())),
                warning: None,
            },
            None => Reachable {
                public_url: None,
                warning: Some(format!(
                    "http.public_url is not set and http.listen is {}: machines are told {}, which only this host reaches; set http.public_url (--http-public-url) to the address machines reach, or enable DHCP on their interface",
                    self.listen,
                    self.public_http_url()
                )),
            },
        }
    }

    /// The URL machines use to reach the boot listener: `public_url` without a
    /// trailing slash, else derived from `listen` (an unspecified address as 127.0.0.1).
    pub fn public_http_url(&self) -> String {
        if let Some(u) = &self.public_url {
            return u.trim_end_matches('/').to_string();
        }
        let addr = self.listen;
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        format!("http://{}:{}", host, addr.port())
    }
}

/// [`HttpConfig::reachable_url`]'s decision.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reachable {
    /// The `public_url` to set (derived), when not configured.
    pub public_url: Option<String>,
    /// Said at start-up: the URL machines get is loopback while the listener is not.
    pub warning: Option<String>,
}

/// What the boot side renders and serves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BootConfig {
    /// iPXE script templates.
    pub ipxe_templates: PathBuf,
    /// Ignition/Butane templates.
    pub ignition_templates: PathBuf,
    /// Image catalog directory.
    pub images_dir: PathBuf,
}

impl Default for BootConfig {
    fn default() -> Self {
        BootConfig {
            ipxe_templates: PathBuf::from("ipxe"),
            ignition_templates: PathBuf::from("ignition"),
            images_dir: PathBuf::from("images"),
        }
    }
}

/// Smallest request head limit accepted (hyper's floor, kept for the same config).
pub(crate) const MIN_HEADER_BYTES: usize = 8192;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold at once.
    pub max_connections_per_source: usize,
    /// Request head limit; at least [`MIN_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout: Duration,
    /// How long a connection may wait for the first byte of a request: after the
    /// accept and between keep-alive requests.
    pub idle_timeout: Duration,
    /// How long in-flight responses may run after shutdown begins.
    pub drain_timeout: Duration,
    /// A response below this average rate (bytes/s) after `send_rate_grace` is ended
    /// ([`ConnError::TooSlow`](super::conn::ConnError::TooSlow)); 0 = off.
    pub min_send_rate: u64,
    /// A response below this average rate after `send_rate_grace` may be evicted for a
    /// new connection when the listener is full ([`SlowRate`](crate::listen::SlowRate)); 0 = never.
    pub slow_send_rate: u64,
    /// How long a response runs before either rate applies.
    pub send_rate_grace: Duration,
}

impl Limits {
    pub(crate) fn from_config(c: &HttpConfig) -> Limits {
        Limits {
            max_connections: c.max_connections.max(1),
            max_connections_per_source: c.max_connections_per_source.max(1),
            max_header_bytes: c.max_header_bytes.max(MIN_HEADER_BYTES),
            header_read_timeout: Duration::from_millis(c.header_read_timeout_ms.max(100)),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms.max(100)),
            drain_timeout: Duration::from_secs(8),
            min_send_rate: c.min_send_rate_bytes_per_sec,
            slow_send_rate: c.slow_send_rate_bytes_per_sec,
            send_rate_grace: Duration::from_millis(c.send_rate_grace_ms.max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_url_is_trimmed_or_derived_from_listen() {
        let mut h = HttpConfig::default();
        assert_eq!(h.public_http_url(), "http://127.0.0.1:8080");
        h.listen = "10.0.0.1:80".parse().unwrap();
        assert_eq!(h.public_http_url(), "http://10.0.0.1:80");
        h.public_url = Some("https://boot.example/".into());
        assert_eq!(h.public_http_url(), "https://boot.example");
    }

    #[test]
    fn reachable_url() {
        let mut h = HttpConfig::default();
        // 0.0.0.0 with the DHCP interface's address: that address.
        let r = h.reachable_url(Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.public_url.as_deref(), Some("http://10.0.0.1:8080"));
        assert_eq!(r.warning, None);
        // 0.0.0.0 without DHCP: loopback URL, warned.
        let r = h.reachable_url(None);
        assert_eq!(r.public_url, None);
        assert!(r.warning.unwrap().contains("http://127.0.0.1:8080"));
        // A configured loopback URL while listening everywhere: warned.
        h.public_url = Some("http://localhost:8080/".into());
        assert!(h.reachable_url(None).warning.is_some());
        // Both on loopback: fine.
        h.listen = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(h.reachable_url(None), Reachable::default());
        h.public_url = Some("http://10.0.0.1:8080".into());
        h.listen = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(h.reachable_url(None), Reachable::default());
        h.validate().unwrap();
        h.public_url = Some("boot.example".into());
        assert!(h.validate().unwrap_err().to_string().contains("public_url"));
    }
}
