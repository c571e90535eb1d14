//! The machine-facing HTTP boot listener.
//!
//! Routes (all `GET`, `HEAD` also on assets):
//! - `/boot.ipxe`: chainload script that sends iPXE to its per-machine script with its
//!   identity (`uuid`, `mac`, `buildarch`, `platform` query parameters).
//! - `/ipxe/script?uuid=&mac=&buildarch=&platform=[&token=]`: the per-machine script for a
//!   machine whose boot configuration is ready, else the configurable default script.
//! - `/ignition/<server>[/<token>]`: the machine's Ignition payload, as given by the index.
//! - `/assets/<path>`: iPXE binaries and image files (`/assets/images/...` comes from the
//!   image catalog directory), with `HEAD`, `Range`, conditionals and no redirects.
//! - `/boot.iso`, `/ipxe/boot.iso?server=&token=`, `/ipxe/boot.efi?server=&token=`: what
//!   a BMC is pointed at for virtual media and UEFI HTTP boot ([`bootiso`]).
//! - `POST /discovery/inventory/<server>[/<token>]`: the discovery agent's inventory
//!   report ([`discovery`]), `POST /discovery/wipe/<server>[/<token>]`: the cleanup
//!   agent's wipe report ([`wipe`]), and `POST /discovery/install/<server>[/<token>]`: the
//!   install agent's report ([`install`]), the routes that read a request body.
//!
//! Identity: a script or Ignition payload is given only to the machine it belongs to: the
//! URL must carry a valid signed, expiring token ([`token`]) minted for that machine's
//! current boot (into its script for Ignition; into its DHCP reply, boot ISO or HTTP
//! boot URI for its script), or, without signed URLs (`http.sign_ignition_urls =
//! false`) and for scripts that hold no secret, the request's source address must be
//! one of the machine's registered addresses. A token dies with the claim, the boot
//! configuration and the power cycle it was minted for. Anyone else gets 403 (known
//! machine, wrong client) and the refusal is logged and counted.
//!
//! The hot path never waits on the store: it asks a [`BootIndex`] answered from memory.
//! [`index::MemoryIndex`] is the in-memory implementation; the store-backed one keeps it
//! current by watch.
//!
//! Routing is a `match` on four fixed prefixes rather than a router crate: the asset
//! route needs the raw (still percent-encoded) path to reject traversal in every
//! encoding before anything is decoded, and the per-request cost stays minimal.

pub mod bootiso;
pub mod catalog;
pub mod conn;
pub mod discovery;
pub mod fat;
pub mod files;
pub mod handler;
pub mod index;
pub mod install;
pub mod iso9660;
mod iso_routes;
pub mod metrics;
mod respond;
pub mod server;
pub mod settings;
pub mod token;
pub mod wipe;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;

use crate::model::ident::Mac;

pub use bootiso::BootArtifact;
pub use handler::BootHttp;
pub use metrics::Metrics;
pub use settings::{BootConfig, HttpConfig};

/// A key into the [`BootIndex`]: what a request says about the machine asking.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MachineId {
    /// Lowercase hyphenated UUID ([`crate::model::ident::parse_uuid`]).
    Uuid(String),
    Mac(Mac),
    Ip(IpAddr),
    /// The Server's name (Ignition URLs and signed script URLs carry it).
    Server(String),
}

/// Where a machine's boot configuration stands, as the boot listener needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootState {
    /// The ServerBootConfiguration is `Ready`: files resolved, Ignition present.
    Ready,
    /// The server exists but no claim (no boot configuration) is bound to it.
    NotClaimed,
    /// The boot configuration is in `Error` (the reason names what is missing).
    Error(String),
    /// The Server is in `Discovery`: it boots the discovery image (`files`) and its agent
    /// posts the inventory.
    Discovery,
    /// The Server is in `Cleanup`: it boots the agent image (`files`), whose agent wipes
    /// every disk by this policy and posts what it did ([`wipe`]).
    Cleanup(bootplane_probe::Policy),
    /// The claim's image is a disk image not yet installed: the machine boots the agent
    /// image (`files`), whose agent installs it ([`install`]); Ignition as for `Ready`.
    Install(Arc<InstallPlan>),
    /// The claim's disk image is installed: the machine boots from its own disk (the
    /// script exits to the firmware's next boot device).
    LocalBoot,
}

/// What an install boot installs: the catalog's disk image and how to choose the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    /// The disk image's catalog reference.
    pub image: String,
    pub image_url: String,
    /// The raw image's SHA-256 the agent must verify.
    pub sha256: String,
    /// Root-device hints as compact JSON (`{}`: the agent's default choice).
    pub root_device_hints: String,
}

/// Kernel, initrd and rootfs URLs plus the default command line of the claimed image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootFiles {
    /// The image reference (e.g. `os-image:latest`).
    pub image: String,
    pub arch: String,
    pub kernel_url: String,
    pub initrd_url: String,
    /// Optional rootfs/squashfs URL; empty when the image has none.
    pub rootfs_url: String,
    /// Default kernel arguments from the image catalog.
    pub cmdline: String,
}

/// The Ignition payload to hand out as-is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnitionData {
    pub data: Bytes,
    pub content_type: String,
}

/// Everything the boot listener knows about one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineBoot {
    /// The Server's name.
    pub server: String,
    /// SMBIOS system UUID, lowercase hyphenated, when known.
    pub uuid: Option<String>,
    /// Registered addresses: the only sources allowed to fetch script and Ignition
    /// without a token (with signed URLs off; with them on, only scripts that hold no
    /// secret).
    pub ips: Vec<IpAddr>,
    pub macs: Vec<Mac>,
    pub state: BootState,
    /// Which boot of the server this entry describes: the ServerBootConfiguration's UID
    /// and generation and the Server's boot generation (bumped by the controller when it
    /// power-cycles the machine): `<uid>/<generation>/<boot generation>`, empty when no
    /// configuration is bound. Signed tokens are bound to it ([`token`]), so a token
    /// minted for one claim, configuration or power cycle is refused once the index
    /// holds another.
    pub boot_id: String,
    /// Present when `state` is `Ready`.
    pub files: Option<BootFiles>,
    pub ignition: Option<IgnitionData>,
}

/// What the agent of a Server in `Discovery` or `Cleanup` reported, checked
/// ([`discovery::check`], [`wipe::check`]) and identified.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReport {
    pub server: String,
    /// The `boot_id` of the entry it was accepted for.
    pub boot_id: String,
    pub client: IpAddr,
    pub report: Report,
}

/// The body of an [`AgentReport`].
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// `POST /discovery/inventory/...` from a Server in `Discovery`.
    Inventory(bootplane_probe::Inventory),
    /// `POST /discovery/wipe/...` from a Server in `Cleanup`.
    Wipe(bootplane_probe::WipeReport),
    /// `POST /discovery/install/...` from a Server installing its disk image.
    Install(bootplane_probe::InstallReport),
}

/// A boot progress step recorded on the ServerBootConfiguration's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootEvent {
    IpxeScriptFetched,
    IgnitionDataFetched,
}

impl BootEvent {
    /// The condition type used on the ServerBootConfiguration's status.
    pub fn condition_type(self) -> &'static str {
        match self {
            BootEvent::IpxeScriptFetched => "IPXEScriptFetched",
            BootEvent::IgnitionDataFetched => "IgnitionDataFetched",
        }
    }
}

/// The boot listener's view of the desired state. Implementations answer from memory
/// and never block on a store; `record_progress` must return at once (queue the status
/// write, do not perform it inline).
pub trait BootIndex: Send + Sync {
    /// Find a machine by UUID (case-insensitive), MAC, IP address or server name.
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>>;
    /// Note that `server` fetched its script or Ignition from `client`.
    fn record_progress(&self, server: &str, event: BootEvent, client: IpAddr);
    /// Hand over a checked agent report (queue it; never write inline). `false` when it
    /// cannot be taken now (queue full, or no writer): the agent retries.
    fn record_report(&self, _report: AgentReport) -> bool {
        false
    }
    /// Whether `client` is one of `m`'s own addresses (the identity check). By default
    /// its registered addresses; an index that knows DHCP leases also counts the
    /// address leased to one of its MACs.
    fn owns(&self, m: &MachineBoot, client: IpAddr) -> bool {
        m.ips.contains(&client)
    }
    /// One-shot Ignition (`http.ignition_once`): `true` the first time it is asked for
    /// `m`'s current boot (its `boot_id`, until the machine is power-cycled), then
    /// `false`. The default index never refuses.
    fn take_ignition(&self, _m: &MachineBoot) -> bool {
        true
    }
    /// The MAC of the DHCP lease `client` holds now, when the index knows leases.
    fn lease_mac(&self, _client: IpAddr) -> Option<Mac> {
        None
    }
}

/// Run the boot listener `app` on `config.listen` (`config.workers` threads, its
/// connection limits) until shutdown. `serve` builds `app` with
/// [`BootHttp::from_config`] and shares it with the API's preview routes.
pub async fn run(
    config: &HttpConfig,
    app: Arc<BootHttp>,
    shutdown: crate::shutdown::Shutdown,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let workers = server::worker_count(config.workers);
    let listeners = server::bind(config.listen, workers)
        .with_context(|| format!("binding boot http listener {}", config.listen))?;
    tracing::info!(listen = %config.listen, workers, public_url = %app.base_url(), "boot http listening");
    server::run_workers(
        listeners,
        app,
        settings::Limits::from_config(config),
        shutdown,
    )
    .await
}
