//! Failure classes of `bootplane provision`, each with its own process exit code.
//!
//! | code | class | meaning |
//! |---|---|---|
//! | 0 | - | image written, verified and synced |
//! | 1 | - | internal error (bug, unexpected OS failure outside the classes below) |
//! | 2 | `Usage` | bad arguments, or no checksum to verify against |
//! | 10 | `Source` | the source cannot be opened or read (missing file, network, NFS, HTTP status) |
//! | 11 | `Truncated` | the source ends before the image does |
//! | 12 | `Trailing` | the source has data after the end of the image |
//! | 13 | `Integrity` | checksum mismatch (frame SHA-256, zstd frame checksum, corrupt zstd data, whole-image SHA-256) |
//! | 14 | `Manifest` | the manifest is missing, invalid, or does not describe the source |
//! | 20 | `TargetBusy` | the target is mounted, has holders, or is held open exclusively |
//! | 21 | `TooSmall` | the target is smaller than the image |
//! | 22 | `TargetIo` | opening, writing, reading back or syncing the target failed |
//! | 23 | `Checkpoint` | the resume checkpoint cannot be written, or the target no longer holds what it records (the checkpoint is dropped; a rerun starts over) |
//!
//! After a failure with code 1, 10-14, 22 or 23 the first MiB of the target (when it
//! exists) is zero, so it does not look bootable. Codes 2, 20 and 21 are refusals made
//! before anything is written: the target is left untouched (it may be mounted).

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("usage: {0}")]
    Usage(String),
    #[error("source: {0}")]
    Source(String),
    #[error("source truncated: {0}")]
    Truncated(String),
    #[error("trailing data after the image: {0}")]
    Trailing(String),
    #[error("verification failed: {0}")]
    Integrity(String),
    #[error("manifest: {0}")]
    Manifest(String),
    #[error("target busy: {0}")]
    TargetBusy(String),
    #[error("target too small: {0}")]
    TooSmall(String),
    #[error("target i/o: {0}")]
    TargetIo(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl ProvisionError {
    pub fn exit_code(&self) -> i32 {
        match self {
            ProvisionError::Internal(_) => 1,
            ProvisionError::Usage(_) => 2,
            ProvisionError::Source(_) => 10,
            ProvisionError::Truncated(_) => 11,
            ProvisionError::Trailing(_) => 12,
            ProvisionError::Integrity(_) => 13,
            ProvisionError::Manifest(_) => 14,
            ProvisionError::TargetBusy(_) => 20,
            ProvisionError::TooSmall(_) => 21,
            ProvisionError::TargetIo(_) => 22,
            ProvisionError::Checkpoint(_) => 23,
        }
    }

    /// Short stable name for JSON progress lines.
    pub fn class(&self) -> &'static str {
        match self {
            ProvisionError::Internal(_) => "internal",
            ProvisionError::Usage(_) => "usage",
            ProvisionError::Source(_) => "source",
            ProvisionError::Truncated(_) => "truncated",
            ProvisionError::Trailing(_) => "trailing",
            ProvisionError::Integrity(_) => "integrity",
            ProvisionError::Manifest(_) => "manifest",
            ProvisionError::TargetBusy(_) => "target_busy",
            ProvisionError::TooSmall(_) => "too_small",
            ProvisionError::TargetIo(_) => "target_io",
            ProvisionError::Checkpoint(_) => "checkpoint",
        }
    }
}

pub type PResult<T> = Result<T, ProvisionError>;
