//! Image pipeline: the packed image format, `bootplane image pack`, and the verified
//! streamer behind `bootplane provision` (read → decode → verify → write).
//!
//! The format, packing and the streamer are the `bootplane-image` crate (shared with the
//! agent's `bootplane probe install`), re-exported here under their old paths; this
//! module adds what only the appliance's binary needs:
//!
//! - [`cli`]: `bootplane image ...` and `bootplane provision`'s arguments (clap);
//! - [`nfs`]: the `nfs://` source, given to the streamer as a [`spec::Scheme`].
pub use bootplane_image::{error, format, hash, pack, progress, source, spec, stream, target};

pub mod cli;
pub mod nfs;
