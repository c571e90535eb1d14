//! The model layer: what the resources are, independent of where they are stored or
//! how they are served. The resource registry (CRDs embedded in the binary), schema
//! validation and the constraints bootplane adds to the CRDs, label selectors and
//! label syntax, machine identities (MAC, UUID), `metadata` accessors, typed views
//! of the fields the controllers read, and what `kubectl get` prints of an object.
//!
//! Imports nothing of the crate but itself: `store`, the protocol servers, the
//! controllers and the REST API all build on it.

pub mod apply;
pub mod constraints;
pub mod ident;
pub mod jsonpatch;
pub mod labels;
pub mod meta;
pub mod printer;
pub mod registry;
pub mod schema;
pub mod selector;
pub mod smp;
pub mod views;
pub mod wire;
