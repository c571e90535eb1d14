//! The document `bootplane probe wipe` prints as its last line and posts (JSON,
//! camelCase): [`WipeReport`], one per run, a [`DiskWipe`] per device. The server
//! deserializes the same types (docs/wipe.md describes every field).

use serde::{Deserialize, Serialize};

/// How much is erased.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Partition tables, signatures, and the first and last MiB of the device and of
    /// every partition (plus btrfs's superblock mirrors).
    Metadata,
    /// Every byte reads as zero afterwards.
    Full,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "metadata" => Some(Policy::Metadata),
            "full" => Some(Policy::Full),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Metadata => "metadata",
            Policy::Full => "full",
        }
    }
}

/// How a device was made zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// `metadata`: the planned ranges overwritten with zeros.
    ZeroRanges,
    /// `full`: `BLKDISCARD`, and discarded blocks read back as zeros.
    Discard,
    /// `full`: `BLKDISCARD` where it zeroed, `BLKZEROOUT` where it did not.
    #[serde(rename = "discard+zeroout")]
    DiscardZeroout,
    /// `full`: `BLKZEROOUT` (the device writes the zeros, or unmaps with zeroing).
    Zeroout,
    /// `full`: zero buffers written with `O_DIRECT`.
    Overwrite,
    /// `full` on a regular file: `fallocate(PUNCH_HOLE|KEEP_SIZE)`.
    PunchHole,
    /// `full` on an NVMe namespace: Format NVM with Secure Erase Settings 1.
    NvmeFormat,
}

/// One run of the wipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WipeReport {
    /// Always `"wipe"`.
    pub action: String,
    pub policy: Policy,
    /// Every device wiped and verified, and nothing refused.
    pub ok: bool,
    /// The machine's SMBIOS system UUID (empty when it has none: a disk image run by hand).
    #[serde(rename = "systemUUID", default)]
    pub system_uuid: String,
    #[serde(default)]
    pub disks: Vec<DiskWipe>,
    /// Why the run was refused before anything was written (mounted, not a device...).
    #[serde(default)]
    pub error: Option<String>,
}

/// What was done to one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskWipe {
    /// The path given or found (`/dev/vda`, or a disk image).
    pub device: String,
    pub size_bytes: u64,
    pub serial: Option<String>,
    /// None when nothing was done (the device could not be opened for writing).
    pub method: Option<Method>,
    /// Ranges zeroed by `metadata` (1 for `full`).
    pub ranges_zeroed: u64,
    /// Bytes the agent wrote itself with `write(2)`; 0 when the device or the kernel
    /// zeroed them (discard, zeroout, punch-hole, nvme-format).
    pub bytes_written: u64,
    /// Bytes read back and found zero.
    pub bytes_verified: u64,
    /// Every zeroed range was read back and was all zero.
    pub verified: bool,
    pub seconds: f64,
    /// Why this device failed (`device is read-only`, `verification failed: ...`).
    pub error: Option<String>,
    /// The offset of the first non-zero byte verification found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_nonzero_offset: Option<u64>,
    /// What the partition-table reader and the method selection noted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl DiskWipe {
    /// A device nothing has been done to yet.
    pub fn new(device: String) -> DiskWipe {
        DiskWipe {
            device,
            size_bytes: 0,
            serial: None,
            method: None,
            ranges_zeroed: 0,
            bytes_written: 0,
            bytes_verified: 0,
            verified: false,
            seconds: 0.0,
            error: None,
            first_nonzero_offset: None,
            notes: Vec::new(),
        }
    }
}
