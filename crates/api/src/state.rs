//! What the API's handlers share ([`ApiState`]): the store, the credentials and roles
//! a request is checked against, the audit log, the open watches, the shutdown and
//! readiness signals. Below every handler module (`auth`, `rest`, `ui`, `admission`),
//! which all take it.

use std::sync::Arc;

use super::audit::Audit;
use super::authz::Roles;
use super::guard::Watches;
use super::tokens::TokenUse;
use crate::store::Store;

/// What the API handlers share.
pub struct ApiState {
    pub store: Store,
    /// The bootstrap token (user `admin`, role `admin`).
    pub token: String,
    /// The built-in and configured roles.
    pub roles: Roles,
    /// Where writes and denials are recorded.
    pub audit: Audit,
    /// Open watches, capped per identity and per connection.
    pub watches: Arc<Watches>,
    /// When named tokens were last noted as used.
    pub token_use: TokenUse,
    pub max_body_bytes: usize,
    /// A request body must arrive within this long of its head (408 after it), so a
    /// client trickling a body cannot hold its connection forever.
    pub body_read_timeout: std::time::Duration,
    /// Open watch streams end when this fires.
    pub shutdown: crate::shutdown::Shutdown,
    /// Other subsystems' metrics (boot HTTP, DHCP, TFTP, ...), registered once at
    /// start-up by `serve` (the handles share their atomics); `/metrics` encodes them
    /// after the store revision.
    pub metrics: prometheus_client::registry::Registry,
    /// True once every service of the appliance has started (`/readyz`).
    pub ready: Arc<std::sync::atomic::AtomicBool>,
}
