//! The document `bootplane probe install` prints as its last line and posts (JSON,
//! camelCase): [`InstallReport`], one per run. The server deserializes the same type
//! (docs/install.md describes every field).

use serde::{Deserialize, Serialize};

/// One run of the install.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallReport {
    /// Always `"install"`.
    pub action: String,
    /// The image was written and verified (and the Ignition config written, when given).
    pub ok: bool,
    /// The machine's SMBIOS system UUID (empty when it has none: a disk image run by hand).
    #[serde(rename = "systemUUID", default)]
    pub system_uuid: String,
    /// The device written (`/dev/sda`); None when none was chosen.
    #[serde(default)]
    pub device: Option<String>,
    /// Why that device: `--device`, or every hint it matched (`size 1 GiB == 1`).
    #[serde(default)]
    pub chosen_by: Vec<String>,
    /// The image as given (an `http://` URL loses its credentials and query).
    pub image: String,
    /// The raw image's SHA-256, once the written bytes were verified against it.
    #[serde(default)]
    pub sha256: Option<String>,
    /// The whole-image SHA-256 matched (the first MiB was written only then).
    pub verified: bool,
    /// Raw image bytes on the device.
    pub bytes_written: u64,
    /// Bytes that were already on the device from an interrupted run (resumed).
    #[serde(default)]
    pub resumed_from: u64,
    pub seconds: f64,
    /// Where the Ignition config was written, when one was given.
    #[serde(default)]
    pub ignition: Option<IgnitionWritten>,
    /// Why the run failed or was refused.
    #[serde(default)]
    pub error: Option<String>,
}

/// The Ignition config written into the installed system's boot partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnitionWritten {
    /// The partition device (`/dev/sda3`).
    pub partition: String,
    /// How it was found: `partlabel boot`, `label boot` or `esp`.
    pub found_by: String,
    /// The path inside that file system (`ignition/config.ign`).
    pub path: String,
    pub bytes: u64,
}

impl InstallReport {
    /// A report of a run that has done nothing yet.
    pub fn new(image: String) -> InstallReport {
        InstallReport {
            action: "install".into(),
            ok: false,
            system_uuid: String::new(),
            device: None,
            chosen_by: Vec::new(),
            image,
            sha256: None,
            verified: false,
            bytes_written: 0,
            resumed_from: 0,
            seconds: 0.0,
            ignition: None,
            error: None,
        }
    }
}
