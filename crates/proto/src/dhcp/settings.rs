//! Typed DHCP settings: the `[dhcp]` section of the config ([`DhcpConfig`], as written
//! in the file), validated into [`DhcpSettings`] with clear errors before the server
//! starts.
//!
//! ```toml
//! [dhcp]
//! enabled = true
//! interface = "eth1"
//! mode = "authoritative"
//! range = "10.0.0.100-10.0.0.200"     # shorthand: one subnet, the interface's
//! server_ip = "10.0.0.1"              # default: the interface's first IPv4 address
//! lease_time_secs = 3600
//! router = "10.0.0.1"
//! dns = ["10.0.0.1"]
//!
//! [[dhcp.subnets]]                    # instead of (or besides) `range`
//! network = "10.1.0.0/24"
//! ranges = ["10.1.0.10-10.1.0.200"]
//! exclude = ["10.1.0.50"]
//! router = "10.1.0.1"
//!
//! [[dhcp.reservations]]
//! mac = "52:54:00:12:34:56"
//! ip = "10.0.0.50"
//! hostname = "node-1"
//!
//! [dhcp.boot]
//! bios = "undionly.kpxe"              # arch 0, TFTP
//! uefi = "ipxe.efi"                   # arch 6/7/9, TFTP (or "snponly.efi")
//! http = "ipxe.efi"                   # arch 15/16, fetched from <public url>/assets/
//! [dhcp.boot.arch]                    # more architecture codes (e.g. ARM64)
//! 11 = "ipxe-arm64.efi"
//! 19 = "http:ipxe-arm64.efi"          # `http:` = UEFI HTTP Boot from /assets/
//! ```

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::model::ident::{self, Mac};

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("dhcp settings: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> SettingsError {
    SettingsError::Invalid(msg.into())
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DhcpMode {
    #[default]
    Proxy,
    Authoritative,
}

impl std::str::FromStr for DhcpMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "proxy" => Ok(DhcpMode::Proxy),
            "authoritative" => Ok(DhcpMode::Authoritative),
            other => bail!("unknown dhcp mode {other:?} (expected proxy or authoritative)"),
        }
    }
}

/// `[dhcp]`: the DHCP server (disabled unless `enabled` or `--dhcp-interface` is
/// given), as written in the file; [`DhcpSettings::from_config`] validates it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DhcpConfig {
    pub enabled: bool,
    pub interface: Option<String>,
    pub mode: DhcpMode,
    /// Authoritative pool range `START-END` for the interface's subnet (shorthand for one subnet).
    pub range: Option<String>,
    /// Our address (option 54); default: the interface's first IPv4 address.
    pub server_ip: Option<Ipv4Addr>,
    /// Prefix length of the `range` subnet (default 24).
    pub prefix_len: Option<u8>,
    /// Lease time in seconds (default 3600).
    pub lease_time_secs: Option<u32>,
    /// How long an offered address is held (default 30 s).
    pub offer_hold_secs: Option<u32>,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub subnets: Vec<SubnetConfig>,
    pub reservations: Vec<ReservationConfig>,
    pub boot: BootFilesConfig,
    /// Packets per second accepted from one MAC (default 20, burst 2x).
    pub rate_limit_per_mac: Option<u32>,
    /// Most packets read and handled per wakeup before replies go out (default 64).
    pub max_batch: Option<usize>,
    /// Group-commit window: least milliseconds between the starts of two lease-log
    /// commits (default 2; 0 = commit as soon as the previous one is done).
    pub commit_window_ms: Option<u64>,
    /// With leases in etcd: the TTL of this appliance's membership lease (2-30 s,
    /// default 3); a killed appliance's clients go to the others within it.
    pub member_ttl_secs: Option<u64>,
}

impl DhcpConfig {
    /// The checks made when the config is loaded (the rest, which need parsing, are
    /// [`DhcpSettings::from_config`]'s, made when the server starts).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.enabled && self.interface.is_none() {
            bail!("dhcp.enabled needs dhcp.interface");
        }
        if self.member_ttl_secs.is_some_and(|t| !(2..=30).contains(&t)) {
            bail!("dhcp.member_ttl_secs must be between 2 and 30");
        }
        if self.mode == DhcpMode::Authoritative
            && self.enabled
            && self.range.is_none()
            && self.subnets.is_empty()
        {
            bail!("authoritative dhcp needs dhcp.range or [[dhcp.subnets]]");
        }
        Ok(())
    }

    /// Every dynamic range and exclusion parses, none is reversed, and no two dynamic
    /// ranges overlap (a lease could be handed out twice from the shared pool). `key`
    /// is the section's name in messages (`dhcp`, `discovery.dhcp`). Checked whether or
    /// not the section is enabled: a config that cannot start when enabled is refused
    /// by `check-config` already.
    pub fn validate_ranges(&self, key: &str) -> anyhow::Result<()> {
        let m = |e: SettingsError| match e {
            SettingsError::Invalid(m) => m,
        };
        let mut all: Vec<(String, Ipv4Addr, Ipv4Addr)> = Vec::new();
        if let Some(r) = &self.range {
            let (a, b) = parse_range(r).map_err(|e| anyhow::anyhow!("{key}.range: {}", m(e)))?;
            all.push((format!("{key}.range"), a, b));
        }
        for (i, s) in self.subnets.iter().enumerate() {
            let at = format!("{key}.subnets[{i}]");
            parse_cidr(&s.network).map_err(|e| anyhow::anyhow!("{at}.network: {}", m(e)))?;
            for r in &s.ranges {
                let (a, b) =
                    parse_range(r).map_err(|e| anyhow::anyhow!("{at}.ranges: {}", m(e)))?;
                all.push((format!("{at}.ranges"), a, b));
            }
            for r in &s.exclude {
                parse_range(r).map_err(|e| anyhow::anyhow!("{at}.exclude: {}", m(e)))?;
            }
        }
        all.sort_by_key(|(_, a, _)| u32::from(*a));
        for w in all.windows(2) {
            let ((k1, a1, b1), (k2, a2, b2)) = (&w[0], &w[1]);
            if u32::from(*a2) <= u32::from(*b1) {
                bail!("{k2}: range {a2}-{b2} overlaps {a1}-{b1} ({k1})");
            }
        }
        Ok(())
    }
}

/// One `[[dhcp.subnets]]` entry as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubnetConfig {
    /// `A.B.C.D/LEN`
    pub network: String,
    /// `START-END` ranges handed out dynamically.
    #[serde(default)]
    pub ranges: Vec<String>,
    /// Addresses or `START-END` ranges never handed out.
    #[serde(default)]
    pub exclude: Vec<String>,
    pub router: Option<Ipv4Addr>,
    #[serde(default)]
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub lease_time_secs: Option<u32>,
}

/// One `[[dhcp.reservations]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationConfig {
    pub mac: String,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
}

/// `[dhcp.boot]`: boot file per firmware. A value is a TFTP file name, a full
/// `http(s)://` URL, or `http:NAME` for `<public url>/assets/NAME`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BootFilesConfig {
    /// Arch 0 (BIOS), default `undionly.kpxe`.
    pub bios: Option<String>,
    /// Arch 6/7/9 (UEFI PXE), default `ipxe.efi`.
    pub uefi: Option<String>,
    /// Arch 15/16 (UEFI HTTP Boot), default `ipxe.efi` from `/assets/`.
    pub http: Option<String>,
    /// next-server / option 66 (default: the server address).
    pub tftp_server: Option<Ipv4Addr>,
    /// What iPXE gets (default `<public url>/boot.ipxe`).
    pub script_url: Option<String>,
    /// More architecture codes (e.g. ARM64 11, 19).
    pub arch: BTreeMap<String, String>,
}

/// One IPv4 subnet with its pools.
#[derive(Debug, Clone, PartialEq)]
pub struct Subnet {
    pub network: Ipv4Addr,
    pub prefix_len: u8,
    /// Inclusive address ranges handed out dynamically.
    pub ranges: Vec<(Ipv4Addr, Ipv4Addr)>,
    /// Inclusive ranges never handed out.
    pub exclude: Vec<(Ipv4Addr, Ipv4Addr)>,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub lease_time_secs: u32,
}

impl Subnet {
    pub(crate) fn mask(&self) -> Ipv4Addr {
        Ipv4Addr::from(prefix_mask(self.prefix_len))
    }

    pub(crate) fn contains(&self, ip: Ipv4Addr) -> bool {
        let m = prefix_mask(self.prefix_len);
        u32::from(ip) & m == u32::from(self.network) & m
    }

    pub(crate) fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) | !prefix_mask(self.prefix_len))
    }

    /// Is `ip` inside one of the dynamic ranges and outside every exclusion?
    pub fn in_pool(&self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        let inr = |r: &(Ipv4Addr, Ipv4Addr)| u32::from(r.0) <= v && v <= u32::from(r.1);
        self.ranges.iter().any(inr) && !self.exclude.iter().any(inr)
    }

    /// Number of addresses in the dynamic pool (ranges minus exclusions).
    pub(crate) fn pool_size(&self) -> u64 {
        let mut n = 0u64;
        for r in &self.ranges {
            for v in u32::from(r.0)..=u32::from(r.1) {
                if self.in_pool(Ipv4Addr::from(v)) {
                    n += 1;
                }
            }
        }
        n
    }
}

/// A fixed address for one MAC (from config now, from registered Servers later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
}

/// How a boot file is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootTarget {
    /// A file name on the TFTP server (next-server).
    Tftp(String),
    /// A full URL for UEFI HTTP Boot (reply carries option 60 `HTTPClient`).
    Http(String),
}

/// Which boot file each firmware gets.
#[derive(Debug, Clone, PartialEq)]
pub struct BootSettings {
    /// Client architecture (option 93) → boot target.
    pub by_arch: BTreeMap<u16, BootTarget>,
    /// What chained iPXE (user class `iPXE` or option 175) gets: `<public url>/boot.ipxe`.
    pub script_url: String,
    /// next-server / option 66; `None` = the server address.
    pub tftp_server: Option<Ipv4Addr>,
}

/// Everything the DHCP core needs, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DhcpSettings {
    pub interface: String,
    pub mode: DhcpMode,
    /// Our address (option 54, siaddr default). `None` = take it from the interface at start.
    pub server_ip: Option<Ipv4Addr>,
    pub subnets: Vec<Subnet>,
    pub reservations: Vec<Reservation>,
    pub boot: BootSettings,
    /// How long an offered address is held for the client.
    pub offer_hold_secs: u32,
    /// Packets per second accepted from one MAC (burst = 2×).
    pub rate_limit_per_mac: u32,
    /// Most packets handled per batch (bounds in-flight work; one fsync per batch).
    pub max_batch: usize,
    /// Least time between the starts of two lease-log commits (group-commit window;
    /// a commit starts earlier when `max_batch` ACKs wait).
    pub commit_window: std::time::Duration,
    /// Prefix length for the `range` shorthand when the interface does not tell.
    pub default_prefix_len: Option<u8>,
    /// With leases in etcd: the membership lease's TTL ([`super::members`]).
    pub member_ttl: std::time::Duration,
}

pub(crate) fn prefix_mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

/// `A-B` (inclusive) or a single address.
pub(crate) fn parse_range(s: &str) -> Result<(Ipv4Addr, Ipv4Addr), SettingsError> {
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let a: Ipv4Addr = a
        .parse()
        .map_err(|_| invalid(format!("bad address range {s:?} (expected START-END)")))?;
    let b: Ipv4Addr = b
        .parse()
        .map_err(|_| invalid(format!("bad address range {s:?} (expected START-END)")))?;
    if u32::from(a) > u32::from(b) {
        return Err(invalid(format!(
            "address range {s:?} ends before it starts"
        )));
    }
    Ok((a, b))
}

fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), SettingsError> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| invalid(format!("bad network {s:?} (expected A.B.C.D/LEN)")))?;
    let ip: Ipv4Addr = a
        .parse()
        .map_err(|_| invalid(format!("bad network {s:?}")))?;
    let len: u8 = l
        .parse()
        .map_err(|_| invalid(format!("bad prefix length in {s:?}")))?;
    if len > 32 {
        return Err(invalid(format!("bad prefix length in {s:?}")));
    }
    Ok((Ipv4Addr::from(u32::from(ip) & prefix_mask(len)), len))
}

fn boot_target(value: &str, public: &str) -> BootTarget {
    if value.starts_with("http://") || value.starts_with("https://") {
        BootTarget::Http(value.to_string())
    } else if let Some(f) = value.strip_prefix("http:") {
        BootTarget::Http(format!("{public}/assets/{f}"))
    } else {
        BootTarget::Tftp(value.to_string())
    }
}

impl DhcpSettings {
    /// Build from the `[dhcp]` section; `public` is the boot listener's URL (the HTTP
    /// boot URLs and the default iPXE script URL are under it).
    pub fn from_config(d: &DhcpConfig, public: &str) -> Result<DhcpSettings, SettingsError> {
        let raw = d;
        let lease_time = raw.lease_time_secs.unwrap_or(3600);
        if lease_time < 10 {
            return Err(invalid("lease_time_secs must be at least 10"));
        }
        let interface = d.interface.clone().unwrap_or_default();

        let mut subnets = Vec::new();
        if let Some(r) = &d.range {
            let (a, b) = parse_range(r)?;
            let len = raw.prefix_len.unwrap_or(24);
            subnets.push(Subnet {
                network: Ipv4Addr::from(u32::from(a) & prefix_mask(len)),
                prefix_len: len,
                ranges: vec![(a, b)],
                exclude: vec![],
                router: raw.router,
                dns: raw.dns.clone(),
                domain: raw.domain.clone(),
                lease_time_secs: lease_time,
            });
            if !subnets[0].contains(b) {
                return Err(invalid(format!(
                    "range {r:?} crosses its /{len} subnet (set dhcp.prefix_len)"
                )));
            }
        }
        for s in &raw.subnets {
            let (network, prefix_len) = parse_cidr(&s.network)?;
            let mut sub = Subnet {
                network,
                prefix_len,
                ranges: vec![],
                exclude: vec![],
                router: s.router.or(raw.router),
                dns: if s.dns.is_empty() {
                    raw.dns.clone()
                } else {
                    s.dns.clone()
                },
                domain: s.domain.clone().or(raw.domain.clone()),
                lease_time_secs: s.lease_time_secs.unwrap_or(lease_time),
            };
            for r in &s.ranges {
                let (a, b) = parse_range(r)?;
                if !sub.contains(a) || !sub.contains(b) {
                    return Err(invalid(format!(
                        "range {r:?} is outside subnet {}",
                        s.network
                    )));
                }
                sub.ranges.push((a, b));
            }
            for r in &s.exclude {
                sub.exclude.push(parse_range(r)?);
            }
            subnets.push(sub);
        }
        if d.mode == DhcpMode::Authoritative && subnets.is_empty() {
            return Err(invalid(
                "authoritative mode needs dhcp.range or [[dhcp.subnets]]",
            ));
        }
        let total: u64 = subnets
            .iter()
            .map(|s| {
                s.ranges
                    .iter()
                    .map(|r| u64::from(u32::from(r.1) - u32::from(r.0)) + 1)
                    .sum::<u64>()
            })
            .sum();
        if total > 1 << 20 {
            return Err(invalid(
                "dynamic pools larger than 1048576 addresses are not supported",
            ));
        }

        let mut reservations = Vec::new();
        for r in &raw.reservations {
            reservations.push(Reservation {
                mac: ident::parse_mac(&r.mac).map_err(|_| {
                    invalid(format!(
                        "bad mac address {:?} (expected aa:bb:cc:dd:ee:ff)",
                        r.mac
                    ))
                })?,
                ip: r.ip,
                hostname: r.hostname.clone(),
            });
        }

        let mut by_arch = BTreeMap::new();
        let bios = raw
            .boot
            .bios
            .clone()
            .unwrap_or_else(|| "undionly.kpxe".into());
        let uefi = raw.boot.uefi.clone().unwrap_or_else(|| "ipxe.efi".into());
        let http = raw.boot.http.clone().unwrap_or_else(|| "ipxe.efi".into());
        by_arch.insert(0, boot_target(&bios, public));
        for a in [6u16, 7, 9] {
            by_arch.insert(a, boot_target(&uefi, public));
        }
        let http_target = match boot_target(&http, public) {
            BootTarget::Tftp(f) => BootTarget::Http(format!("{public}/assets/{f}")),
            t => t,
        };
        by_arch.insert(15, http_target.clone());
        by_arch.insert(16, http_target);
        for (k, v) in &raw.boot.arch {
            let code: u16 = k.parse().map_err(|_| {
                invalid(format!("boot.arch key {k:?} is not an architecture number"))
            })?;
            by_arch.insert(code, boot_target(v, public));
        }
        let script_url = raw
            .boot
            .script_url
            .clone()
            .unwrap_or_else(|| format!("{public}/boot.ipxe"));

        Ok(DhcpSettings {
            interface,
            mode: d.mode,
            server_ip: raw.server_ip,
            subnets,
            reservations,
            boot: BootSettings {
                by_arch,
                script_url,
                tftp_server: raw.boot.tftp_server,
            },
            offer_hold_secs: raw.offer_hold_secs.unwrap_or(30),
            rate_limit_per_mac: raw.rate_limit_per_mac.unwrap_or(20).max(1),
            max_batch: raw.max_batch.unwrap_or(64).clamp(1, 8192),
            commit_window: std::time::Duration::from_millis(
                raw.commit_window_ms.unwrap_or(2).min(100),
            ),
            default_prefix_len: raw.prefix_len,
            member_ttl: std::time::Duration::from_secs(
                raw.member_ttl_secs.unwrap_or(3).clamp(2, 30),
            ),
        })
    }
}

/// `[dhcp]` of a whole config file's text (other sections ignored), for tests.
#[cfg(test)]
pub(crate) fn section_from_toml(text: &str) -> Result<DhcpConfig, toml::de::Error> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        dhcp: DhcpConfig,
    }
    toml::from_str::<File>(text).map(|f| f.dhcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boot listener's URL with the default `[http]` section.
    const PUBLIC: &str = "http://127.0.0.1:8080";

    fn cfg(text: &str) -> DhcpConfig {
        section_from_toml(text).unwrap()
    }

    #[test]
    fn range_shorthand_and_defaults() {
        let c = cfg("[dhcp]\nenabled = true\ninterface = \"eth1\"\nmode = \"authoritative\"\nrange = \"10.0.0.100-10.0.0.200\"\nrouter = \"10.0.0.1\"\n");
        let s = DhcpSettings::from_config(&c, "http://10.0.0.1:8080").unwrap();
        assert_eq!(s.subnets.len(), 1);
        assert_eq!(s.subnets[0].network, Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(s.subnets[0].pool_size(), 101);
        assert_eq!(s.boot.by_arch[&0], BootTarget::Tftp("undionly.kpxe".into()));
        assert_eq!(s.boot.by_arch[&7], BootTarget::Tftp("ipxe.efi".into()));
        assert_eq!(
            s.boot.by_arch[&16],
            BootTarget::Http("http://10.0.0.1:8080/assets/ipxe.efi".into())
        );
        assert_eq!(s.boot.script_url, "http://10.0.0.1:8080/boot.ipxe");
    }

    #[test]
    fn subnets_reservations_and_arch_map() {
        let c = cfg(r#"
[dhcp]
mode = "authoritative"
[[dhcp.subnets]]
network = "10.1.0.0/24"
ranges = ["10.1.0.10-10.1.0.20"]
exclude = ["10.1.0.15"]
[[dhcp.reservations]]
mac = "52:54:00:12:34:56"
ip = "10.1.0.50"
[dhcp.boot]
uefi = "snponly.efi"
[dhcp.boot.arch]
11 = "ipxe-arm64.efi"
19 = "http:ipxe-arm64.efi"
"#);
        let s = DhcpSettings::from_config(&c, PUBLIC).unwrap();
        assert_eq!(s.subnets[0].pool_size(), 10);
        assert!(!s.subnets[0].in_pool(Ipv4Addr::new(10, 1, 0, 15)));
        assert_eq!(s.reservations[0].mac, [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(s.boot.by_arch[&7], BootTarget::Tftp("snponly.efi".into()));
        assert_eq!(
            s.boot.by_arch[&11],
            BootTarget::Tftp("ipxe-arm64.efi".into())
        );
        assert!(
            matches!(&s.boot.by_arch[&19], BootTarget::Http(u) if u.ends_with("/assets/ipxe-arm64.efi"))
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = section_from_toml("[dhcp]\nleasetime = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("leasetime"), "{e}");
        let e = section_from_toml("[dhcp.boot]\nbio = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bio"), "{e}");
        let e = DhcpSettings::from_config(
            &cfg("[dhcp]\nmode = \"authoritative\"\nrange = \"10.0.0.9-10.0.0.1\"\n"),
            PUBLIC,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ends before"), "{e}");
        let e = DhcpSettings::from_config(
            &cfg("[dhcp]\n[[dhcp.reservations]]\nmac = \"zz\"\nip = \"10.0.0.1\"\n"),
            PUBLIC,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("mac"), "{e}");
        let e = DhcpSettings::from_config(&cfg("[dhcp]\nmode = \"authoritative\"\n"), PUBLIC)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs"), "{e}");
    }
}
