//! Image pipeline: the packed image format, `bootplane image pack`, and the
//! verified streamer behind `bootplane provision` (read → decode → verify → write).
//!
//! - [`format`]: independent zstd frames + seek table + JSON manifest.
//! - [`pack`]: packing with one compressor per core.
//! - [`stream`]: the provisioning pipeline, its safety rules and resume.
//! - [`source`] / [`nfs`]: local, `http://` and `nfs://` sources; [`spec`] picks one.
//! - [`target`]: O_DIRECT block-device/file targets and their checks.
//! - [`progress`]: progress bar / JSON lines (schema in that module).
//! - [`error`]: failure classes and their exit codes.
pub mod cli;
pub mod error;
pub mod format;
pub mod hash;
pub mod nfs;
pub mod pack;
pub mod progress;
pub mod source;
pub mod spec;
pub mod stream;
pub mod target;
