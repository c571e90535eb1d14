//! The `[discovery]` config section.
//!
//! ```toml
//! [discovery]
//! enabled = true                       # BMC systems → Servers, first boots
//! first_boot = true                    # boot each new Server into the discovery image
//! image = "bootplane-discovery:latest" # catalog reference of the discovery image
//! report_timeout_secs = 600            # per boot, until the agent's inventory arrives
//! attempts = 3                         # boots before a Server is left in Discovery
//! retry_backoff_secs = 30              # off this long before the next boot (doubling)
//! lldp_wait_secs = 10                  # how long the agent listens for LLDP
//! mac_db = "/etc/bootplane/bmc-macs.yaml" # MAC prefix → BMC protocol, port, default secret
//! approved_bmcs = ["10.10.0.0/24"]     # BMC addresses whose systems need no approval
//! max_new_endpoints = 64               # Endpoints (BMCs, BMCSecrets) created per interval
//! max_systems_per_bmc = 64             # Servers one BMC's systems may become
//! new_endpoints_interval_secs = 60
//!
//! [discovery.dhcp]                     # the management scope (BMCs' DHCP)
//! enabled = true
//! interface = "mgmt0"
//! mode = "authoritative"
//! range = "10.10.0.100-10.10.0.250"
//! ```

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

/// `[discovery]`: off unless `enabled`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    pub enabled: bool,
    /// Boot each new Server with a BMC once into the discovery image; without it a
    /// discovered Server waits in `Initial` for an operator's inventory.
    pub first_boot: bool,
    /// The image catalog reference of the discovery image (kernel + initramfs with the
    /// agent; `scripts/make-discovery-image.sh` builds it).
    pub image: String,
    /// How long one boot may take to report its inventory.
    pub report_timeout_secs: u64,
    /// Boots before the Server is left in `Discovery` with reason `InventoryTimeout`.
    pub attempts: u32,
    /// Powered off this long after a boot that did not report (doubling per attempt).
    pub retry_backoff_secs: u64,
    /// How long the agent listens for LLDP neighbours (kernel argument `bootplane.lldp_wait`).
    pub lldp_wait_secs: u32,
    // Management network (BMCs → Endpoints → BMCs); kept together.
    /// The MAC-prefix database ([`super::macdb`]); without it no lease becomes an Endpoint.
    pub mac_db: Option<PathBuf>,
    /// BMC addresses (IPs or CIDR prefixes) whose systems become Servers approved. A
    /// Server discovered from any other BMC carries the label `bootplane.dev/approval:
    /// pending` and is neither booted nor claimable until an operator approves it.
    pub approved_bmcs: Vec<String>,
    /// At most this many Endpoints (each with its BMC and BMCSecret) are created from
    /// management leases per `new_endpoints_interval_secs`.
    pub max_new_endpoints: u32,
    pub new_endpoints_interval_secs: u64,
    /// At most this many Servers name one BMC: systems a BMC lists beyond it are not
    /// registered (the BMC's condition `SystemsDiscovered` turns False, reason
    /// `TooManySystems`, with a Warning Event), so a rogue BMC listing thousands of
    /// systems makes at most this many claimable-looking Servers.
    pub max_systems_per_bmc: u32,
    /// `[discovery.dhcp]`: the management scope, a second authoritative DHCP server on
    /// its own interface whose granted leases become Endpoints.
    pub dhcp: crate::dhcp::DhcpConfig,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            enabled: false,
            first_boot: true,
            image: "bootplane-discovery:latest".into(),
            report_timeout_secs: 600,
            attempts: 3,
            retry_backoff_secs: 30,
            lldp_wait_secs: 10,
            mac_db: None,
            approved_bmcs: Vec::new(),
            max_new_endpoints: 64,
            new_endpoints_interval_secs: 60,
            max_systems_per_bmc: 64,
            dhcp: Default::default(),
        }
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<()> {
        if self.report_timeout_secs == 0 {
            bail!("discovery.report_timeout_secs must be at least 1");
        }
        if self.attempts == 0 {
            bail!("discovery.attempts must be at least 1");
        }
        if self.lldp_wait_secs > 120 {
            bail!("discovery.lldp_wait_secs must be at most 120");
        }
        if self.enabled && self.first_boot && self.image.trim().is_empty() {
            bail!("discovery.first_boot needs discovery.image");
        }
        if self.max_new_endpoints == 0 || self.new_endpoints_interval_secs == 0 {
            bail!("discovery.max_new_endpoints and discovery.new_endpoints_interval_secs must be at least 1");
        }
        if self.max_systems_per_bmc == 0 || self.max_systems_per_bmc > 100_000 {
            bail!("discovery.max_systems_per_bmc must be 1 to 100000");
        }
        self.approved()?;
        self.validate_management()
    }

    /// The management scope's checks: authoritative, its own interface.
    fn validate_management(&self) -> Result<()> {
        if !self.dhcp.enabled {
            return Ok(());
        }
        if self.dhcp.mode != crate::dhcp::DhcpMode::Authoritative {
            bail!("discovery.dhcp.mode must be \"authoritative\" (the management scope hands out addresses)");
        }
        self.dhcp
            .validate()
            .context("discovery.dhcp (the management scope)")?;
        Ok(())
    }

    /// `approved_bmcs`, parsed.
    pub fn approved(&self) -> Result<ApprovedBmcs> {
        let list = (self.approved_bmcs.iter())
            .map(|a| {
                a.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "discovery.approved_bmcs: {a:?} is not an IP address or CIDR prefix"
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok(ApprovedBmcs(list))
    }

    /// What the BMC reconciler registers Servers with: the approved addresses and the
    /// cap on Servers per BMC.
    pub fn systems_policy(&self) -> Result<Discover> {
        Ok(Discover {
            approved: self.approved()?,
            max_systems: self.max_systems_per_bmc as usize,
        })
    }

    /// The cap on Endpoints created from management leases.
    pub fn cap(&self) -> Cap {
        Cap {
            max: self.max_new_endpoints,
            interval: std::time::Duration::from_secs(self.new_endpoints_interval_secs),
        }
    }

    /// Whether the management scope runs.
    pub fn management(&self) -> bool {
        self.enabled && self.dhcp.enabled
    }
}

/// `discovery.approved_bmcs`, parsed: the BMC addresses (IPs or prefixes) trusted without
/// an operator's approval, for Endpoints (credentials) and the Servers of their BMCs.
#[derive(Debug, Clone, Default)]
pub struct ApprovedBmcs(pub Vec<crate::nfs::ClientMatch>);

impl ApprovedBmcs {
    /// Whether `ip` (text, as an Endpoint or BMC spec holds it) is approved; text that is
    /// not an address is not.
    pub(crate) fn contains(&self, ip: &str) -> bool {
        ip.parse()
            .is_ok_and(|ip| self.0.iter().any(|m| m.contains(ip)))
    }
}

/// How the BMCs' systems become Servers (`[discovery]`).
#[derive(Debug, Clone)]
pub struct Discover {
    /// BMC addresses whose Servers need no approval (`discovery.approved_bmcs`).
    pub approved: ApprovedBmcs,
    /// Most Servers naming one BMC (`discovery.max_systems_per_bmc`).
    pub max_systems: usize,
}

/// How many Endpoints discovery may create per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub max: u32,
    pub interval: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<DiscoveryConfig> {
        let c: DiscoveryConfig = toml::from_str(toml_text)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn management_scope_keys_parse_and_are_checked() {
        let c = parse(
            "enabled = true\nmac_db = \"/m.yaml\"\n[dhcp]\nenabled = true\ninterface = \"m0\"\nmode = \"authoritative\"\nrange = \"10.9.0.10-10.9.0.20\"\n",
        )
        .unwrap();
        assert!(c.management());
        assert_eq!(c.mac_db.as_deref(), Some(std::path::Path::new("/m.yaml")));
        assert_eq!(c.dhcp.interface.as_deref(), Some("m0"));
        assert!(!DiscoveryConfig::default().management());
        let e = parse("[dhcp]\nenabled = true\ninterface = \"m0\"\n").unwrap_err();
        assert!(e.to_string().contains("authoritative"), "{e}");
        let e = parse(
            "[dhcp]\nenabled = true\nmode = \"authoritative\"\nrange = \"10.9.0.10-10.9.0.20\"\n",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("interface"), "{e:#}");
        assert!(parse("[dhcp]\nbogus = 1\n").is_err());
        let c = parse("approved_bmcs = [\"10.10.0.0/24\", \"192.0.2.7\"]\nmax_new_endpoints = 5\n")
            .unwrap();
        let a = c.approved().unwrap();
        assert!(a.contains("10.10.0.99"));
        assert!(!a.contains("10.10.1.1"));
        assert!(a.contains("192.0.2.7"));
        assert!(!a.contains("bmc.example"));
        assert_eq!(c.cap().max, 5);
        let e = parse("approved_bmcs = [\"bmc.example\"]\n").unwrap_err();
        assert!(e.to_string().contains("approved_bmcs"), "{e}");
        assert!(parse("max_new_endpoints = 0\n").is_err());
        assert!(parse("max_systems_per_bmc = 0\n").is_err());
        assert_eq!(DiscoveryConfig::default().max_systems_per_bmc, 64);
        let p = parse("max_systems_per_bmc = 2\n")
            .unwrap()
            .systems_policy()
            .unwrap();
        assert_eq!(p.max_systems, 2);
    }
}
