//! `[power.redfish]` ([`RedfishConfig`]), the one-time boot modes and the annotations
//! that choose them per Server, and [`BootTargets`], the boot listener's signed URLs the
//! driver points BMCs at.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::redfish;

/// Server annotation choosing the one-time network boot.
pub(crate) const BOOT_MODE_ANNOTATION: &str = "bootplane.dev/boot-mode";
/// BMC (or Server, for an inline `spec.bmc`) annotation: `"true"` skips TLS
/// certificate verification for that BMC.
pub const INSECURE_ANNOTATION: &str = "bootplane.dev/bmc-insecure-skip-verify";

/// The one-time network boot set before power-on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BootMode {
    None,
    Pxe,
    UefiHttp,
    VirtualMedia,
}

impl BootMode {
    pub(crate) fn parse(s: &str) -> Option<BootMode> {
        Some(match s {
            "None" => BootMode::None,
            "Pxe" => BootMode::Pxe,
            "UefiHttp" => BootMode::UefiHttp,
            "VirtualMedia" => BootMode::VirtualMedia,
            _ => return None,
        })
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BootMode::None => "None",
            BootMode::Pxe => "Pxe",
            BootMode::UefiHttp => "UefiHttp",
            BootMode::VirtualMedia => "VirtualMedia",
        }
    }
}

/// What `HttpBootUri` points at: the per-machine boot ISO or the iPXE EFI binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpBootArtifact {
    Iso,
    Efi,
}

/// `[power.redfish]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedfishConfig {
    /// One-time boot for Servers without the annotation.
    pub boot_mode: BootMode,
    pub http_boot_artifact: HttpBootArtifact,
    /// How often every Server's power state is read from its BMC.
    pub poll_interval_secs: u64,
    /// How long a graceful shutdown may take before `ForceOff`.
    pub shutdown_timeout_secs: u64,
    /// How long the BMC may take to report the asked-for state after a reset.
    pub power_wait_secs: u64,
    /// Longest wait between two attempts of a failing operation.
    pub retry_max_secs: u64,
    /// Per request to a BMC.
    pub timeout_secs: u64,
    /// Attempts per request (connect errors, timeouts, 5xx, 429).
    pub attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub per_bmc_concurrency: usize,
    pub global_concurrency: usize,
    /// PEM bundle of the CAs BMC certificates are verified against.
    pub ca_bundle: Option<PathBuf>,
    pub task_timeout_secs: u64,
    /// Refused credential attempts per BMC per `auth_interval_secs`; beyond them calls
    /// fail without contacting the BMC (so wrong default credentials never lock it out).
    pub auth_attempts: u32,
    pub auth_interval_secs: u64,
}

impl Default for RedfishConfig {
    fn default() -> Self {
        RedfishConfig {
            boot_mode: BootMode::Pxe,
            http_boot_artifact: HttpBootArtifact::Iso,
            poll_interval_secs: 30,
            shutdown_timeout_secs: 120,
            power_wait_secs: 300,
            retry_max_secs: 300,
            timeout_secs: 20,
            attempts: 4,
            backoff_base_ms: 500,
            backoff_max_ms: 10_000,
            per_bmc_concurrency: 4,
            global_concurrency: 64,
            ca_bundle: None,
            task_timeout_secs: 300,
            auth_attempts: 3,
            auth_interval_secs: 300,
        }
    }
}

impl RedfishConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        for (k, v) in [
            ("poll_interval_secs", self.poll_interval_secs),
            ("power_wait_secs", self.power_wait_secs),
            ("retry_max_secs", self.retry_max_secs),
            ("timeout_secs", self.timeout_secs),
            ("attempts", self.attempts as u64),
            ("per_bmc_concurrency", self.per_bmc_concurrency as u64),
            ("global_concurrency", self.global_concurrency as u64),
            ("task_timeout_secs", self.task_timeout_secs),
            ("auth_attempts", self.auth_attempts as u64),
            ("auth_interval_secs", self.auth_interval_secs),
        ] {
            anyhow::ensure!(v > 0, "power.redfish.{k} must be at least 1");
        }
        anyhow::ensure!(
            self.backoff_base_ms <= self.backoff_max_ms,
            "power.redfish.backoff_base_ms must not exceed backoff_max_ms"
        );
        Ok(())
    }

    /// The client settings (reads the CA bundle).
    pub(crate) fn client_settings(&self) -> anyhow::Result<redfish::Settings> {
        use anyhow::Context as _;
        let ca_pem = match &self.ca_bundle {
            Some(p) => Some(
                std::fs::read(p)
                    .with_context(|| format!("reading power.redfish.ca_bundle {}", p.display()))?,
            ),
            None => None,
        };
        Ok(redfish::Settings {
            timeout: Duration::from_secs(self.timeout_secs),
            attempts: self.attempts,
            backoff_base: Duration::from_millis(self.backoff_base_ms),
            backoff_max: Duration::from_millis(self.backoff_max_ms),
            per_bmc_concurrency: self.per_bmc_concurrency,
            global_concurrency: self.global_concurrency,
            ca_pem,
            task_timeout: Duration::from_secs(self.task_timeout_secs),
            auth_attempts: self.auth_attempts,
            auth_interval: Duration::from_secs(self.auth_interval_secs),
        })
    }
}

/// Where a BMC is pointed for a network boot: the boot listener's signed per-machine
/// URLs (the composition root plugs the boot listener in here).
pub trait BootTargets: Send + Sync {
    /// The machine's own UEFI HTTP boot URI, `None` when there is no boot listener.
    fn http_boot_uri(&self, server: &str, artifact: HttpBootArtifact) -> Option<String>;
    /// The boot ISO a BMC mounts as virtual media for this machine.
    fn media_uri(&self, server: &str) -> Option<String>;
    /// Whether `uri` is one of this listener's (media bootplane inserted).
    fn owns(&self, uri: &str) -> bool;
}
