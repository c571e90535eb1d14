//! Image pipeline: the packed image format, `bootplane image pack`, and the verified
//! streamer behind `bootplane provision` and the agent's `bootplane probe install`
//! (read → decode → verify → write), one code path for "stream an image to this device".
//!
//! A bottom-layer crate (ARCHITECTURE.md, "Crate map"): it depends on no other bootplane
//! crate and on nothing async, so the static agent links it. `bootplane-proto` re-exports
//! its modules as `image::*` and adds the CLI (`image::cli`) and the `nfs://` source
//! (`image::nfs`, given to the streamer through [`stream::Options::schemes`]).
//!
//! - [`format`]: independent zstd frames + seek table + JSON manifest.
//! - [`pack`]: packing with one compressor per core.
//! - [`stream`]: the provisioning pipeline, its safety rules and resume.
//! - [`source`]: local and `http://` sources; [`spec`] picks one.
//! - [`target`]: O_DIRECT block-device/file targets and their checks.
//! - [`progress`]: progress bar / JSON lines (schema in that module).
//! - [`error`]: failure classes and their exit codes.
pub mod error;
pub mod format;
pub mod hash;
pub mod pack;
pub mod progress;
pub mod source;
pub mod spec;
pub mod stream;
pub mod target;
