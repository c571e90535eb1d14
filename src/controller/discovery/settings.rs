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
//! ```

use anyhow::{bail, Result};
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
        Ok(())
    }
}
