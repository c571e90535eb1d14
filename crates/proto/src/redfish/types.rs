//! The Redfish objects and settings the client speaks in.

use std::time::Duration;

/// `[power.redfish]` client settings (see `docs/redfish.md`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Per request (connect + response), not per operation.
    pub timeout: Duration,
    /// Attempts for one request that fails with a connect error, timeout, 5xx or 429.
    pub attempts: u32,
    /// First backoff; doubles per attempt up to `backoff_max`, full jitter.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Requests in flight to one BMC at most.
    pub per_bmc_concurrency: usize,
    /// Requests in flight to all BMCs at most.
    pub global_concurrency: usize,
    /// PEM CA bundle BMC certificates are verified against (besides none: no system
    /// roots are used, BMCs carry site certificates).
    pub ca_pem: Option<Vec<u8>>,
    /// Longest a task monitor is polled.
    pub task_timeout: Duration,
    /// Refused credential attempts per BMC within `auth_interval` before further ones
    /// fail locally ([`Error::AuthThrottled`]) instead of reaching the BMC (no lockout).
    pub auth_attempts: u32,
    pub auth_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timeout: Duration::from_secs(20),
            attempts: 4,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            per_bmc_concurrency: 4,
            global_concurrency: 64,
            ca_pem: None,
            task_timeout: Duration::from_secs(300),
            auth_attempts: 3,
            auth_interval: Duration::from_secs(300),
        }
    }
}

/// A secret string: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach one BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https://10.0.0.5:443` (scheme, host, port; no path, no credentials).
    pub base_url: String,
    pub username: String,
    pub password: Password,
    /// Skip certificate verification for this BMC (explicit opt-out).
    pub insecure: bool,
}

/// Why a Redfish call failed; [`Error::reason`] is the condition reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("bmc unreachable: {0}")]
    Unreachable(String),
    #[error("bmc did not answer within {0:?}")]
    Timeout(Duration),
    #[error("bmc refused the credentials (http {0})")]
    Unauthorized(u16),
    /// Not sent: the credentials were refused `attempts` times within the interval.
    #[error("bmc refused the credentials {attempts} times; authentication throttled (nothing sent), next attempt in {retry_in_secs}s or when the credentials change")]
    AuthThrottled { attempts: u32, retry_in_secs: u64 },
    #[error("tls: {0}")]
    Tls(String),
    #[error("bmc answered http {status}: {message}")]
    Status { status: u16, message: String },
    #[error("malformed response from the bmc: {0}")]
    Malformed(String),
    #[error("bmc does not support {0}")]
    Unsupported(String),
    #[error("bmc task failed: {0}")]
    TaskFailed(String),
}

impl Error {
    /// A CamelCase condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Unreachable(_) => "Unreachable",
            Error::Timeout(_) => "Timeout",
            Error::Unauthorized(_) | Error::AuthThrottled { .. } => "CredentialsRefused",
            Error::Tls(_) => "TLSError",
            Error::Status { .. } => "BMCError",
            Error::Malformed(_) => "MalformedResponse",
            Error::Unsupported(_) => "FeatureMissing",
            Error::TaskFailed(_) => "TaskFailed",
        }
    }
    /// Worth retrying later (the BMC may come back); credentials and missing features
    /// are not fixed by waiting.
    pub fn transient(&self) -> bool {
        !matches!(
            self,
            Error::Unauthorized(_)
                | Error::AuthThrottled { .. }
                | Error::Unsupported(_)
                | Error::Tls(_)
        )
    }
}

/// `ComputerSystem.PowerState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Paused,
}

impl PowerState {
    pub fn parse(s: &str) -> Option<PowerState> {
        Some(match s {
            "On" => PowerState::On,
            "Off" => PowerState::Off,
            "PoweringOn" => PowerState::PoweringOn,
            "PoweringOff" => PowerState::PoweringOff,
            "Paused" => PowerState::Paused,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::On => "On",
            PowerState::Off => "Off",
            PowerState::PoweringOn => "PoweringOn",
            PowerState::PoweringOff => "PoweringOff",
            PowerState::Paused => "Paused",
        }
    }
}

/// `ResetType` of `#ComputerSystem.Reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetType {
    On,
    ForceOff,
    GracefulShutdown,
    ForceRestart,
    GracefulRestart,
    PowerCycle,
}

impl ResetType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ResetType::On => "On",
            ResetType::ForceOff => "ForceOff",
            ResetType::GracefulShutdown => "GracefulShutdown",
            ResetType::ForceRestart => "ForceRestart",
            ResetType::GracefulRestart => "GracefulRestart",
            ResetType::PowerCycle => "PowerCycle",
        }
    }
}

/// `Boot.BootSourceOverrideTarget` values bootplane sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootTarget {
    None,
    Pxe,
    UefiHttp,
    Cd,
    Hdd,
}

impl BootTarget {
    pub fn as_str(self) -> &'static str {
        match self {
            BootTarget::None => "None",
            BootTarget::Pxe => "Pxe",
            BootTarget::UefiHttp => "UefiHttp",
            BootTarget::Cd => "Cd",
            BootTarget::Hdd => "Hdd",
        }
    }
}

/// A one-time (or continuous) boot override to PATCH into `ComputerSystem.Boot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootOverride {
    pub target: BootTarget,
    /// `Once` (true) or `Continuous`.
    pub once: bool,
    /// `Boot.HttpBootUri` (with `UefiHttp`).
    pub http_boot_uri: Option<String>,
    /// `Boot.BootSourceOverrideMode` (`UEFI`, `Legacy`), when it should be set.
    pub mode: Option<String>,
}

/// What a BMC's `ComputerSystem.Boot` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boot {
    pub target: Option<String>,
    pub enabled: Option<String>,
    pub mode: Option<String>,
    pub http_boot_uri: Option<String>,
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`; empty when the BMC does not
    /// say (then every target is tried).
    pub allowed_targets: Vec<String>,
}

/// The parts of a `ComputerSystem` bootplane reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct System {
    /// `@odata.id`, e.g. `/redfish/v1/Systems/437XR1138R2`.
    pub odata_id: String,
    pub id: String,
    pub uuid: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub serial_number: Option<String>,
    pub bios_version: Option<String>,
    pub power_state: Option<PowerState>,
    pub boot: Boot,
    /// `Actions.#ComputerSystem.Reset.target`.
    pub reset_target: Option<String>,
    /// `ResetType@Redfish.AllowableValues`; empty when the BMC does not say.
    pub reset_types: Vec<String>,
    /// The ETag the BMC sent with it (header or `@odata.etag`).
    pub etag: Option<String>,
    /// `Links.ManagedBy[].@odata.id`.
    pub managers: Vec<String>,
    /// `VirtualMedia.@odata.id` on the system, when the BMC puts it there.
    pub virtual_media: Option<String>,
    /// `EthernetInterfaces.@odata.id`: the host's NICs as the BMC knows them.
    pub ethernet_interfaces: Option<String>,
}

/// One host NIC a BMC reports (`EthernetInterface`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EthernetInterface {
    pub id: String,
    /// `MACAddress` (else `PermanentMACAddress`), as the BMC wrote it.
    pub mac: Option<String>,
    /// `LinkStatus` (`LinkUp`, `LinkDown`, `NoLink`).
    pub link_status: Option<String>,
}

/// The parts of a `Manager` bootplane reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manager {
    pub odata_id: String,
    pub firmware_version: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    /// `VirtualMedia.@odata.id`.
    pub virtual_media: Option<String>,
}

/// `ServiceRoot`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRoot {
    pub redfish_version: Option<String>,
    pub uuid: Option<String>,
    pub vendor: Option<String>,
    pub product: Option<String>,
    /// `SessionService.@odata.id` (absent: basic auth only).
    pub session_service: Option<String>,
}

/// One `VirtualMedia` device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VirtualMedia {
    pub odata_id: String,
    pub id: String,
    pub media_types: Vec<String>,
    pub image: Option<String>,
    pub inserted: bool,
    /// `Actions.#VirtualMedia.InsertMedia.target`.
    pub insert_target: Option<String>,
    pub eject_target: Option<String>,
    pub etag: Option<String>,
}
