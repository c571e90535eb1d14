//! A minimal ISO 9660 image writer for the boot ISO ([`super::bootiso`]): one flat root
//! directory of a few files, and optionally an El Torito no-emulation boot entry whose
//! boot file gets its boot information table patched in, as `mkisofs -no-emul-boot
//! -boot-load-size 4 -boot-info-table` and `xorriso -boot-info-table` do (ISOLINUX reads
//! the table to find itself on the disc), plus a UEFI (platform 0xEF) entry for an EFI
//! System Partition image, as `xorriso -eltorito-alt-boot -e efi.img -no-emul-boot`.
//!
//! Hand-written rather than a crate: the maintained pure-Rust writer on crates.io,
//! `hadris-iso` (2.x, 3.0 in release candidates), needs Rust 1.88 (bootplane's MSRV is
//! 1.85), brings a family of six `hadris-*` crates with an API that changed with each of
//! its recent major versions, and its writer works on a `Read + Write + Seek` target;
//! `isobemak` writes to a file path and builds FAT ESPs bootplane does not need. What
//! bootplane needs is ~250 lines with no I/O (a protocol core: bytes in, bytes out), so
//! the image is built in memory and served from there.
//!
//! Layout (2048-byte sectors): 0–15 system area (zeros), 16 primary volume descriptor,
//! 17 El Torito boot record, 18 terminator, 19/20 the little/big-endian path tables,
//! then the root directory, the boot catalog and the files, each on its own sectors.
//! Names are uppercase d-characters with at most one dot (ISO 9660 level 2, ≤ 30
//! characters), stored with the `;1` version suffix; there is no Rock Ridge or Joliet.

const SECTOR: usize = 2048;
const PVD_LBA: u32 = 16;
const BOOT_RECORD_LBA: u32 = 17;
const TERMINATOR_LBA: u32 = 18;
const L_PATH_LBA: u32 = 19;
const M_PATH_LBA: u32 = 20;
const ROOT_LBA: u32 = 21;

/// One file of the root directory.
#[derive(Debug, Clone)]
pub(crate) struct IsoFile<'a> {
    /// Its name, e.g. `isolinux.bin`; stored uppercase (`ISOLINUX.BIN;1`).
    pub name: &'a str,
    pub data: &'a [u8],
}

/// The El Torito boot entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ElTorito<'a> {
    /// Name of the boot file (one of the image's files), loaded with no emulation.
    pub boot_file: &'a str,
    /// 512-byte sectors the BIOS loads (4 for ISOLINUX, as `-boot-load-size 4`).
    pub load_sectors: u16,
    /// Patch the boot information table into the boot file (bytes 8..64).
    pub boot_info_table: bool,
    /// Name of a file of the image that is an EFI System Partition image (FAT), for a
    /// second, UEFI (platform 0xEF) no-emulation entry, as `xorriso -eltorito-alt-boot
    /// -e efi.img -no-emul-boot` adds.
    pub efi_image: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IsoError {
    #[error("iso file name {0:?} is not 1-30 characters of A-Z, 0-9, _ with at most one dot")]
    BadName(String),
    #[error("iso file name {0:?} appears twice")]
    Duplicate(String),
    #[error("boot file {0:?} is not one of the image's files")]
    NoBootFile(String),
    #[error("boot file {0:?} is too short for a boot information table (64 bytes)")]
    BootFileTooShort(String),
    #[error("iso image too large")]
    TooLarge,
}

/// Build the image: `volume_id` (up to 32 d-characters, uppercased), `files` in the
/// root directory, an optional El Torito entry, all timestamps `unix_secs` (UTC).
pub(crate) fn build(
    volume_id: &str,
    files: &[IsoFile<'_>],
    boot: Option<ElTorito<'_>>,
    unix_secs: u64,
) -> Result<Vec<u8>, IsoError> {
    let mut names: Vec<(String, usize)> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let n = iso_name(f.name)?;
        if names.iter().any(|(m, _)| *m == n) {
            return Err(IsoError::Duplicate(f.name.to_string()));
        }
        names.push((n, i));
    }
    // Directory records are sorted by name (ECMA-119 9.3).
    names.sort();
    let find = |name: &str| -> Result<usize, IsoError> {
        let n = iso_name(name)?;
        names
            .iter()
            .find(|(m, _)| *m == n)
            .map(|(_, i)| *i)
            .ok_or_else(|| IsoError::NoBootFile(name.to_string()))
    };
    let (boot_idx, efi_idx) = match boot {
        Some(b) => {
            let i = find(b.boot_file)?;
            if b.boot_info_table && files[i].data.len() < 64 {
                return Err(IsoError::BootFileTooShort(b.boot_file.to_string()));
            }
            (Some(i), b.efi_image.map(find).transpose()?)
        }
        None => (None, None),
    };
    let date = DirDate::from_unix(unix_secs);
    // The root directory's size: records never cross a sector boundary.
    let record_lens = [34usize, 34]
        .into_iter()
        .chain(names.iter().map(|(n, _)| record_len(n.len() + 2)));
    let root_sectors = sectors_for_records(record_lens);
    let catalog_lba = ROOT_LBA + root_sectors;
    let mut next = catalog_lba + u32::from(boot.is_some());
    let mut extents = vec![0u32; files.len()];
    for (_, i) in &names {
        extents[*i] = next;
        let len = u32::try_from(files[*i].data.len()).map_err(|_| IsoError::TooLarge)?;
        next = next
            .checked_add(len.div_ceil(SECTOR as u32))
            .ok_or(IsoError::TooLarge)?;
    }
    let total = next;
    let size = usize::try_from(total).map_err(|_| IsoError::TooLarge)? * SECTOR;
    let mut img = vec![0u8; size];

    let root_size = root_sectors * SECTOR as u32;
    let root_rec = dir_record(&[0], ROOT_LBA, root_size, true, &date);
    write_pvd(
        sector_mut(&mut img, PVD_LBA),
        volume_id,
        total,
        &root_rec,
        &date,
    );
    if boot.is_some() {
        let s = sector_mut(&mut img, BOOT_RECORD_LBA);
        s[1..6].copy_from_slice(b"CD001");
        s[6] = 1;
        s[7..7 + 23].copy_from_slice(b"EL TORITO SPECIFICATION");
        s[71..75].copy_from_slice(&catalog_lba.to_le_bytes());
    }
    let t = sector_mut(&mut img, TERMINATOR_LBA);
    t[0] = 255;
    t[1..6].copy_from_slice(b"CD001");
    t[6] = 1;
    // Path tables: the root only (dir id 0x00, parent 1), 10 bytes each.
    let lp = sector_mut(&mut img, L_PATH_LBA);
    lp[0] = 1;
    lp[2..6].copy_from_slice(&ROOT_LBA.to_le_bytes());
    lp[6..8].copy_from_slice(&1u16.to_le_bytes());
    let mp = sector_mut(&mut img, M_PATH_LBA);
    mp[0] = 1;
    mp[2..6].copy_from_slice(&ROOT_LBA.to_be_bytes());
    mp[6..8].copy_from_slice(&1u16.to_be_bytes());

    // Root directory: ".", "..", then the files.
    let mut records = vec![
        root_rec.clone(),
        dir_record(&[1], ROOT_LBA, root_size, true, &date),
    ];
    for (n, i) in &names {
        let id = format!("{n};1");
        // Lengths fit: every file's sectors were counted in a u32 above.
        let len = files[*i].data.len() as u32;
        records.push(dir_record(id.as_bytes(), extents[*i], len, false, &date));
    }
    let mut off = ROOT_LBA as usize * SECTOR;
    for r in records {
        if off % SECTOR + r.len() > SECTOR {
            off = off.next_multiple_of(SECTOR);
        }
        img[off..off + r.len()].copy_from_slice(&r);
        off += r.len();
    }
    for (i, f) in files.iter().enumerate() {
        let at = extents[i] as usize * SECTOR;
        img[at..at + f.data.len()].copy_from_slice(f.data);
    }
    if let (Some(b), Some(i)) = (boot, boot_idx) {
        let efi = efi_idx.map(|e| (extents[e], files[e].data.len()));
        write_catalog(
            sector_mut(&mut img, catalog_lba),
            extents[i],
            b.load_sectors,
            efi,
        );
        if b.boot_info_table {
            let at = extents[i] as usize * SECTOR;
            let len = files[i].data.len();
            patch_boot_info_table(&mut img[at..at + len], extents[i]);
        }
    }
    Ok(img)
}

/// The boot information table (El Torito as extended by mkisofs): at byte 8 of the boot
/// file, the PVD's LBA, the file's LBA, its length and the 32-bit sum of its
/// little-endian words from byte 64 on; bytes 24..64 zero.
fn patch_boot_info_table(file: &mut [u8], file_lba: u32) {
    let mut sum = 0u32;
    for chunk in file[64..].chunks(4) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        sum = sum.wrapping_add(u32::from_le_bytes(w));
    }
    let len = file.len() as u32;
    let t = &mut file[8..64];
    t.fill(0);
    t[0..4].copy_from_slice(&PVD_LBA.to_le_bytes());
    t[4..8].copy_from_slice(&file_lba.to_le_bytes());
    t[8..12].copy_from_slice(&len.to_le_bytes());
    t[12..16].copy_from_slice(&sum.to_le_bytes());
}

/// Validation entry (x86, checksummed, 55 AA) and the default entry: bootable, no
/// emulation, default load segment, `load_sectors` 512-byte sectors from `lba`; then,
/// with `efi` (LBA, length), a final section header for platform 0xEF (UEFI) with one
/// no-emulation entry covering that image.
fn write_catalog(s: &mut [u8], lba: u32, load_sectors: u16, efi: Option<(u32, usize)>) {
    s[0] = 1;
    s[30] = 0x55;
    s[31] = 0xAA;
    let sum = s[..32].chunks(2).fold(0u16, |a, w| {
        a.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
    });
    s[28..30].copy_from_slice(&0u16.wrapping_sub(sum).to_le_bytes());
    let e = &mut s[32..64];
    e[0] = 0x88;
    e[6..8].copy_from_slice(&load_sectors.to_le_bytes());
    e[8..12].copy_from_slice(&lba.to_le_bytes());
    if let Some((efi_lba, len)) = efi {
        let h = &mut s[64..96];
        h[0] = 0x91;
        h[1] = 0xEF;
        h[2..4].copy_from_slice(&1u16.to_le_bytes());
        let e = &mut s[96..128];
        e[0] = 0x88;
        // 512-byte sectors; 0 when it does not fit (firmware then reads to the end).
        let count = u16::try_from(len.div_ceil(512)).unwrap_or(0);
        e[6..8].copy_from_slice(&count.to_le_bytes());
        e[8..12].copy_from_slice(&efi_lba.to_le_bytes());
    }
}

fn write_pvd(s: &mut [u8], volume_id: &str, total: u32, root: &[u8], date: &DirDate) {
    s[0] = 1;
    s[1..6].copy_from_slice(b"CD001");
    s[6] = 1;
    pad(&mut s[8..40], "");
    let vid: String = volume_id
        .chars()
        .map(|c| c.to_ascii_uppercase())
        .filter(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
        .take(32)
        .collect();
    pad(&mut s[40..72], &vid);
    both32(&mut s[80..88], total);
    both16(&mut s[120..124], 1);
    both16(&mut s[124..128], 1);
    both16(&mut s[128..132], SECTOR as u16);
    both32(&mut s[132..140], 10);
    s[140..144].copy_from_slice(&L_PATH_LBA.to_le_bytes());
    s[148..152].copy_from_slice(&M_PATH_LBA.to_be_bytes());
    s[156..190].copy_from_slice(root);
    pad(&mut s[190..318], "");
    pad(&mut s[318..446], "");
    pad(&mut s[446..574], "");
    pad(&mut s[574..702], "BOOTPLANE");
    pad(&mut s[702..813], "");
    let stamp = date.long();
    s[813..830].copy_from_slice(&stamp);
    s[830..847].copy_from_slice(&stamp);
    s[847..863].fill(b'0');
    s[864..880].fill(b'0');
    s[881] = 1;
}

fn dir_record(id: &[u8], lba: u32, len: u32, dir: bool, date: &DirDate) -> Vec<u8> {
    let mut r = vec![0u8; record_len(id.len())];
    r[0] = r.len() as u8;
    both32(&mut r[2..10], lba);
    both32(&mut r[10..18], len);
    r[18..25].copy_from_slice(&date.short());
    r[25] = if dir { 2 } else { 0 };
    both16(&mut r[28..32], 1);
    r[32] = id.len() as u8;
    r[33..33 + id.len()].copy_from_slice(id);
    r
}

/// A directory record's length for an identifier of `id_len` bytes (padded to even).
fn record_len(id_len: usize) -> usize {
    let n = 33 + id_len;
    n + n % 2
}

fn sectors_for_records(lens: impl Iterator<Item = usize>) -> u32 {
    let mut off = 0usize;
    for l in lens {
        if off % SECTOR + l > SECTOR {
            off = off.next_multiple_of(SECTOR);
        }
        off += l;
    }
    off.div_ceil(SECTOR).max(1) as u32
}

/// `name` as an ISO 9660 level 2 identifier (without the `;1`).
fn iso_name(name: &str) -> Result<String, IsoError> {
    let up = name.to_ascii_uppercase();
    let ok = !up.is_empty()
        && up.len() <= 30
        && up.matches('.').count() <= 1
        && !up.starts_with('.')
        && up
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    if ok {
        Ok(up)
    } else {
        Err(IsoError::BadName(name.to_string()))
    }
}

fn sector_mut(img: &mut [u8], lba: u32) -> &mut [u8] {
    let at = lba as usize * SECTOR;
    &mut img[at..at + SECTOR]
}

fn pad(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    dst[..s.len()].copy_from_slice(s.as_bytes());
}

fn both16(dst: &mut [u8], v: u16) {
    dst[0..2].copy_from_slice(&v.to_le_bytes());
    dst[2..4].copy_from_slice(&v.to_be_bytes());
}

fn both32(dst: &mut [u8], v: u32) {
    dst[0..4].copy_from_slice(&v.to_le_bytes());
    dst[4..8].copy_from_slice(&v.to_be_bytes());
}

/// A UTC timestamp broken down for the two ISO 9660 date formats.
struct DirDate {
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    min: u32,
    sec: u32,
}

impl DirDate {
    fn from_unix(secs: u64) -> DirDate {
        let days = secs / 86_400;
        let rem = secs % 86_400;
        // Civil from days (Howard Hinnant's algorithm), for days since 1970-01-01.
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as u32;
        DirDate {
            // Directory records store the year as an offset from 1900 in one byte.
            year: year.clamp(1900, 2155),
            month,
            day,
            hour: (rem / 3600) as u32,
            min: (rem / 60 % 60) as u32,
            sec: (rem % 60) as u32,
        }
    }

    /// The 7-byte directory record date (GMT offset 0).
    fn short(&self) -> [u8; 7] {
        [
            (self.year - 1900) as u8,
            self.month as u8,
            self.day as u8,
            self.hour as u8,
            self.min as u8,
            self.sec as u8,
            0,
        ]
    }

    /// The 17-byte volume descriptor date: `YYYYMMDDHHMMSScc` and the GMT offset.
    fn long(&self) -> [u8; 17] {
        let s = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            self.year, self.month, self.day, self.hour, self.min, self.sec
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(s.as_bytes());
        out
    }
}

#[cfg(test)]
#[path = "iso9660_tests.rs"]
mod tests;
