//! What a BMC is pointed at: the boot ISO (virtual media, and UEFI HTTP boot on BMCs
//! that boot a downloaded ISO as a CD, as sushy-tools does) and the iPXE EFI binary
//! (UEFI HTTP boot), served by the boot listener.
//!
//! The ISO is built here, in memory ([`super::iso9660`]), with two El Torito entries:
//! - BIOS: ISOLINUX (`isolinux.bin`, its boot information table patched, and
//!   `ldlinux.c32`) boots iPXE's `ipxe.lkrn` with the chain script as its initrd; iPXE
//!   runs an initrd that is a script (`#!ipxe`) as its script, so the ISO holds
//!   `#!ipxe`, `dhcp`, `chain <URL>`. This is the layout of iPXE's own `ipxe.iso`
//!   (ISOLINUX + `ipxe.krn`) with the script given at boot instead of compiled in.
//! - UEFI: an EFI System Partition image ([`super::fat`]) with `ipxe.efi` as
//!   `EFI/BOOT/BOOTX64.EFI`. Debian bookworm's iPXE (2019) cannot read a script from
//!   the CD under UEFI (`autoexec.ipxe` came in 2021), so there iPXE autoboots: its
//!   DHCP request gets bootplane's answer (`/boot.ipxe`, when bootplane's DHCP serves
//!   the network) and the machine is identified by MAC/UUID, not by the ISO's token.
//!
//! Routes:
//! - `/boot.iso`: the generic ISO; its script chains `<base_url>/boot.ipxe`, which finds
//!   the machine by MAC/UUID as a PXE boot does ([`BootHttp::boot_iso_url`](crate::http::BootHttp::boot_iso_url));
//! - `/ipxe/boot.iso?server=NAME&token=T`: the machine's own ISO, whose script chains its
//!   signed script URL ([`BootHttp::signed_script_url`](crate::http::BootHttp::signed_script_url));
//! - `/ipxe/boot.efi?server=NAME&token=T`: `ipxe.efi` (assets directory, else Debian's
//!   `/usr/lib/ipxe`), for a UEFI HTTP boot URI.
//!
//! The per-machine URLs come from [`BootHttp::signed_boot_url`](crate::http::BootHttp::signed_boot_url) with a token of their own
//! purpose ([`Purpose::BootIso`], [`Purpose::BootEfi`]): a script token fetches no ISO
//! and an ISO token no script; like the others it dies with the boot it was minted for.
//! A bad or expired token gets 403, an unknown server 404, a missing ISOLINUX/iPXE file
//! 503 naming it (and a warning at start-up). `HEAD`, `Range` (one range; several get
//! the whole image) and conditionals work on the ISO as on files; its ETag is a digest
//! of its bytes.
//!
//! The four files are read once at start-up (and the ESP image made then). An ISO is built once per distinct script:
//! the generic one once, a machine's again only when its boot changes or its token is
//! past half its lifetime (as scripts are cached). An ISO is ~1.4 MiB (Debian's
//! `ipxe.efi` is 830 KiB, `ipxe.lkrn` 300 KiB); building one (copying and a SHA-256)
//! takes about a millisecond, so it is done on the request's task.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::fat;
use super::files::FileMeta;
use super::iso9660::{self, ElTorito, IsoFile};
use super::settings::BootIsoConfig;
use super::token::Purpose;
use crate::sys::unix_now;

/// A per-machine boot target (what a BMC's UEFI HTTP boot URI points at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootArtifact {
    /// The machine's boot ISO (`/ipxe/boot.iso`).
    Iso,
    /// The iPXE EFI binary (`/ipxe/boot.efi`).
    Efi,
}

impl BootArtifact {
    pub(super) fn purpose(self) -> Purpose {
        match self {
            BootArtifact::Iso => Purpose::BootIso,
            BootArtifact::Efi => Purpose::BootEfi,
        }
    }

    pub(super) fn path(self) -> &'static str {
        match self {
            BootArtifact::Iso => "/ipxe/boot.iso",
            BootArtifact::Efi => "/ipxe/boot.efi",
        }
    }
}

/// ISOLINUX's configuration: boot iPXE with the chain script as its initrd, at once.
pub(crate) const ISOLINUX_CFG: &str =
    "DEFAULT ipxe\nPROMPT 0\nTIMEOUT 0\nLABEL ipxe\n KERNEL ipxe.krn\n INITRD chain.ipx\n";

/// The script inside an ISO: bring the network up, continue at `url`.
pub(crate) fn chain_script(url: &str) -> String {
    format!("#!ipxe\ndhcp\nchain {url}\n")
}

/// Cached ISOs beyond this are dropped wholesale (~1.4 MiB each: 45 MiB at most).
const ISO_CACHE_MAX: usize = 32;

/// The ISO's third-party files, read at start-up.
struct Parts {
    isolinux_bin: Vec<u8>,
    ldlinux_c32: Vec<u8>,
    ipxe_lkrn: Vec<u8>,
    /// FAT image with `ipxe.efi` as `EFI/BOOT/BOOTX64.EFI`, made at start-up.
    esp: Vec<u8>,
}

/// A built ISO with its validators.
pub(super) struct Image {
    pub(super) body: Bytes,
    pub(super) meta: FileMeta,
}

struct Cached {
    /// The boot the embedded token was minted for ("" for the generic ISO).
    boot_id: String,
    minted: u64,
    image: Arc<Image>,
}

/// The boot ISO builder and its cache, held by [`BootHttp`](crate::http::BootHttp).
pub(crate) struct BootIso {
    /// `Err`: why no ISO can be built (a file missing), said to whoever asks for one.
    parts: Result<Parts, String>,
    /// Timestamp of the ISOs' files and `Last-Modified` (start-up time).
    stamp: u64,
    cache: Mutex<HashMap<String, Cached>>,
}

impl BootIso {
    /// No ISO: every request for one gets 503 (a [`BootHttp`](crate::http::BootHttp) built without config).
    pub(crate) fn unconfigured() -> BootIso {
        BootIso::with_parts(Err("boot iso not configured".into()))
    }

    /// Read the files `cfg` names (at start-up). A missing one is logged as a warning
    /// and makes ISO requests fail with its name; the rest of the listener is unaffected.
    pub(crate) fn load(cfg: &BootIsoConfig) -> BootIso {
        let read = |p: &Path, pkg: &str| {
            std::fs::read(p).map_err(|e| format!("{} ({pkg}): {e}", p.display()))
        };
        let parts = (|| {
            let efi = read(&cfg.ipxe_efi, "Debian ipxe")?;
            Ok(Parts {
                isolinux_bin: read(&cfg.isolinux_bin, "Debian isolinux")?,
                ldlinux_c32: read(&cfg.ldlinux_c32, "Debian syslinux-common")?,
                ipxe_lkrn: read(&cfg.ipxe_lkrn, "Debian ipxe")?,
                esp: fat::esp_with_bootx64(&efi)
                    .map_err(|e| format!("{}: {e}", cfg.ipxe_efi.display()))?,
            })
        })();
        if let Err(e) = &parts {
            tracing::warn!(error = %e, "boot iso unavailable (http.boot_iso): /boot.iso and /ipxe/boot.iso will answer 503");
        }
        BootIso::with_parts(parts)
    }

    /// From the files' bytes (tests).
    #[cfg(test)]
    pub fn from_bytes(
        isolinux_bin: Vec<u8>,
        ldlinux_c32: Vec<u8>,
        ipxe_lkrn: Vec<u8>,
        ipxe_efi: &[u8],
    ) -> Result<BootIso, fat::FatError> {
        Ok(BootIso::with_parts(Ok(Parts {
            isolinux_bin,
            ldlinux_c32,
            ipxe_lkrn,
            esp: fat::esp_with_bootx64(ipxe_efi)?,
        })))
    }

    fn with_parts(parts: Result<Parts, String>) -> BootIso {
        BootIso {
            parts,
            stamp: unix_now(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The ISO image booting `script`.
    pub(crate) fn image(&self, script: &str) -> Result<Vec<u8>, String> {
        let p = self.parts.as_ref().map_err(Clone::clone)?;
        let files = [
            IsoFile {
                name: "isolinux.bin",
                data: &p.isolinux_bin,
            },
            IsoFile {
                name: "ldlinux.c32",
                data: &p.ldlinux_c32,
            },
            IsoFile {
                name: "isolinux.cfg",
                data: ISOLINUX_CFG.as_bytes(),
            },
            IsoFile {
                name: "ipxe.krn",
                data: &p.ipxe_lkrn,
            },
            IsoFile {
                name: "chain.ipx",
                data: script.as_bytes(),
            },
            IsoFile {
                name: "efi.img",
                data: &p.esp,
            },
        ];
        let el = ElTorito {
            boot_file: "isolinux.bin",
            load_sectors: 4,
            boot_info_table: true,
            efi_image: Some("efi.img"),
        };
        iso9660::build("BOOTPLANE", &files, Some(el), self.stamp).map_err(|e| e.to_string())
    }

    /// The cached image under `key` if made for `boot_id` less than `fresh_for` seconds
    /// ago, else the one `script()` gives (built and cached).
    pub(super) fn cached(
        &self,
        key: &str,
        boot_id: &str,
        fresh_for: u64,
        script: impl FnOnce(u64) -> String,
    ) -> Result<Arc<Image>, String> {
        let now = unix_now();
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = cache.get(key) {
                if c.boot_id == boot_id && now >= c.minted && now - c.minted < fresh_for {
                    return Ok(c.image.clone());
                }
            }
        }
        let body = Bytes::from(self.image(&script(now))?);
        let digest = Sha256::digest(&body);
        let mut meta = FileMeta::new(
            body.len() as u64,
            UNIX_EPOCH + Duration::from_secs(self.stamp),
        );
        meta.etag = format!("\"{}\"", hex(&digest[..12]));
        let image = Arc::new(Image { body, meta });
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= ISO_CACHE_MAX {
            cache.clear();
        }
        cache.insert(
            key.to_string(),
            Cached {
                boot_id: boot_id.to_string(),
                minted: now,
                image: image.clone(),
            },
        );
        Ok(image)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
#[path = "bootiso_tests.rs"]
mod tests;
