//! bootplane: a boot and image-serving appliance for bare-metal fleets.
//!
//! See `ARCHITECTURE.md` for the code map. The binary (`src/main.rs`) only parses
//! the command line and dispatches into the modules below.

pub mod api;
pub mod cli;
pub mod config;
pub mod controller;
pub mod decode;
pub mod dhcp;
pub mod http;
pub mod ignition;
pub mod image;
pub mod ipxe;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod nfs;
pub mod power;
pub mod provision;
pub mod redfish;
pub mod serve;
pub mod shutdown;
pub mod statedir;
pub mod sys;
pub mod tftp;
pub mod tls;

// The layers extracted into crates of their own (crates/), under their old module names so
// `crate::model::...` and `crate::store::...` paths read as before.
pub use bootplane_model as model;
pub use bootplane_store as store;
