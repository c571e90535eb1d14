//! The `[controller]` config section: whether `serve` runs the embedded reconcilers,
//! how many reconciles run at once, and which power driver acts on Servers.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Embedded controller settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Run the reconcilers inside `serve`.
    pub enabled: bool,
    /// Concurrent reconciles per controller (cheap async tasks; more of them means
    /// bigger group commits).
    pub workers: usize,
    /// Power driver for servers: `manual`, `test` (accepts every request at once) or
    /// `qemu` (a VM per server, see `[power.qemu]`).
    pub power_driver: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            enabled: true,
            workers: 64,
            power_driver: "manual".into(),
        }
    }
}

impl ControllerConfig {
    /// Semantic checks that TOML typing cannot express.
    pub fn validate(&self) -> Result<()> {
        if self.workers == 0 {
            bail!("controller.workers must be at least 1");
        }
        match self.power_driver.as_str() {
            "manual" | "test" | "qemu" => {}
            other => {
                bail!("unknown controller.power_driver {other:?} (expected manual, test or qemu)")
            }
        }
        Ok(())
    }
}
