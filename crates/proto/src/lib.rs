//! bootplane's base helpers (L0) and protocol layer (L3): the modules the `bootplane`
//! package re-exports under their old names (`bootplane::dhcp`, `bootplane::tls`, ...).
//!
//! L0, the helpers every layer may use: `decode`, `listen`, `logging`, `net`, `shutdown`,
//! `statedir`, `sys`, `tls`. L3, the protocol cores and servers, each with its own config
//! section: `dhcp`, `http`, `ignition`, `image`, `ipxe`, `nfs`, `power`, `provision`,
//! `redfish`, `tftp`. This crate depends on the model and store crates only (of
//! bootplane's): the controllers, the API, the CLI, `config` and `serve` are above it and
//! cannot be imported from here. Inside the crate the L0 helpers import no L3 module
//! (`tests/it/tidy.rs`, `LAYERS`). See ARCHITECTURE.md's crate map.

pub mod decode;
pub mod dhcp;
pub mod http;
pub mod ignition;
pub mod image;
pub mod ipxe;
pub mod listen;
pub mod logging;
pub mod net;
pub mod nfs;
pub mod power;
pub mod provision;
pub mod redfish;
pub mod shutdown;
pub mod statedir;
pub mod sys;
pub mod tftp;
pub mod tls;

// The layers below, under their module names so `crate::model::...` and
// `crate::store::...` paths read as they do in the `bootplane` package.
pub use bootplane_model as model;
pub use bootplane_store as store;
