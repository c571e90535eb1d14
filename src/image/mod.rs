//! Image format, packing and streaming (read → decode → verify → write). Owned by issue 7.
pub mod cli;
