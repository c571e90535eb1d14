//! The client: [`Pool`] (TLS, limits, sessions) and [`Bmc`] (one BMC's calls).
//!
//! CONTRACT (the lead wrote the signatures; the client work fills the bodies and may add
//! private helpers, but keeps these public signatures).

use std::sync::Arc;

use super::types::*;

/// Per-BMC request counters (tests and the benchmark read them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BmcStats {
    /// Requests sent (every attempt counts).
    pub requests: u64,
    /// The most requests in flight at once.
    pub max_in_flight: u64,
}

/// Shared by every BMC: TLS configuration, the global and per-BMC concurrency limits,
/// sessions, counters. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    _inner: Arc<()>,
}

impl Pool {
    pub fn new(_settings: Settings) -> Result<Pool, Error> {
        todo!()
    }
    /// A handle on one BMC (cheap; sessions and limits are shared through the pool,
    /// keyed by `base_url` and username).
    pub fn bmc(&self, _target: Target) -> Bmc {
        todo!()
    }
    /// Counters of the BMC at `base_url`.
    pub fn stats(&self, _base_url: &str) -> BmcStats {
        todo!()
    }
}

/// One BMC.
#[derive(Clone)]
pub struct Bmc {
    _inner: Arc<()>,
}

impl Bmc {
    pub async fn service_root(&self) -> Result<ServiceRoot, Error> {
        todo!()
    }
    /// `@odata.id`s of `/redfish/v1/Systems` members.
    pub async fn systems(&self) -> Result<Vec<String>, Error> {
        todo!()
    }
    /// A system by `@odata.id`.
    pub async fn system(&self, _odata_id: &str) -> Result<System, Error> {
        todo!()
    }
    /// The system whose UUID is `uuid` (case-insensitive), or the only system when
    /// `uuid` is `None`; `Error::Unsupported` names what was not found.
    pub async fn find_system(&self, _uuid: Option<&str>) -> Result<System, Error> {
        todo!()
    }
    pub async fn manager(&self, _odata_id: &str) -> Result<Manager, Error> {
        todo!()
    }
    /// `POST` the system's reset action; follows a task monitor to completion.
    pub async fn reset(&self, _system: &System, _kind: ResetType) -> Result<(), Error> {
        todo!()
    }
    /// `PATCH` `Boot` (with `If-Match` when the BMC gave an ETag); `Error::Unsupported`
    /// when `allowed_targets` is known and lacks the target.
    pub async fn set_boot_override(&self, _system: &System, _o: &BootOverride) -> Result<(), Error> {
        todo!()
    }
    /// The virtual media devices of a system (its own collection, else its managers').
    pub async fn virtual_media(&self, _system: &System) -> Result<Vec<VirtualMedia>, Error> {
        todo!()
    }
    /// `InsertMedia` (Inserted, WriteProtected) `image` into `vm`.
    pub async fn insert_media(&self, _vm: &VirtualMedia, _image: &str) -> Result<(), Error> {
        todo!()
    }
    pub async fn eject_media(&self, _vm: &VirtualMedia) -> Result<(), Error> {
        todo!()
    }
}
