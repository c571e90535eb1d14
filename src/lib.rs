//! bootplane: a boot and image-serving appliance for bare-metal fleets.
//!
//! See `ARCHITECTURE.md` for the code map. The binary (`src/main.rs`) only parses
//! the command line and dispatches into the modules below.

pub mod config;
pub mod metrics;
pub mod serve;

// The layers extracted into crates of their own (crates/), under their old module names so
// `crate::model::...`, `crate::dhcp::...`, `crate::controller::...` and `bootplane::tls::...`
// paths read as before.
pub use bootplane_api as api;
pub use bootplane_cli as cli;
pub use bootplane_controller as controller;
pub use bootplane_model as model;
pub use bootplane_proto::{
    decode, dhcp, http, ignition, image, ipxe, listen, logging, net, nfs, power, provision,
    redfish, shutdown, statedir, sys, tftp, tls,
};
pub use bootplane_store as store;
