//! A minimal FAT12 image writer: the EFI System Partition image inside the boot ISO
//! (its El Torito UEFI entry, [`super::iso9660`]), holding one file at
//! `EFI/BOOT/BOOTX64.EFI`, the path UEFI firmware boots from removable media. No I/O:
//! bytes in, bytes out. Layout as `mkfs.fat` makes it for a small floppy-like volume:
//! 512-byte sectors, 4 per cluster, 2 FATs, 512 root entries; the two directories take
//! clusters 2 and 3, the file the clusters after them.

const SECTOR: usize = 512;
const PER_CLUSTER: usize = 4;
const CLUSTER: usize = SECTOR * PER_CLUSTER;
const ROOT_ENTRIES: usize = 512;
/// FAT12 holds fewer than 4085 clusters.
const MAX_CLUSTERS: usize = 4084;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FatError {
    #[error("efi boot file of {0} bytes does not fit a FAT12 image")]
    TooLarge(usize),
}

/// A FAT12 image with `data` as `EFI/BOOT/BOOTX64.EFI`.
pub(crate) fn esp_with_bootx64(data: &[u8]) -> Result<Vec<u8>, FatError> {
    let file_clusters = data.len().div_ceil(CLUSTER).max(1);
    let clusters = 2 + file_clusters;
    if clusters > MAX_CLUSTERS {
        return Err(FatError::TooLarge(data.len()));
    }
    let fat_sectors = ((clusters + 2) * 3).div_ceil(2).div_ceil(SECTOR);
    let root_sectors = ROOT_ENTRIES * 32 / SECTOR;
    let data_start = 1 + 2 * fat_sectors + root_sectors;
    let total = data_start + clusters * PER_CLUSTER;
    let mut img = vec![0u8; total * SECTOR];
    boot_sector(&mut img[..SECTOR], total as u16, fat_sectors as u16);

    // FAT: media + end marker, the two directories (one cluster each), the file's chain.
    let mut fat = vec![0u8; fat_sectors * SECTOR];
    set12(&mut fat, 0, 0xFF8);
    set12(&mut fat, 1, 0xFFF);
    set12(&mut fat, 2, 0xFFF);
    set12(&mut fat, 3, 0xFFF);
    for i in 0..file_clusters {
        let c = 4 + i;
        set12(
            &mut fat,
            c,
            if i + 1 == file_clusters {
                0xFFF
            } else {
                c as u16 + 1
            },
        );
    }
    for n in 0..2 {
        let at = (1 + n * fat_sectors) * SECTOR;
        img[at..at + fat.len()].copy_from_slice(&fat);
    }
    let root = (1 + 2 * fat_sectors) * SECTOR;
    entry(&mut img[root..], b"EFI        ", 0x10, 2, 0);
    let cluster_at = |c: usize| (data_start + (c - 2) * PER_CLUSTER) * SECTOR;
    let efi = cluster_at(2);
    entry(&mut img[efi..], b".          ", 0x10, 2, 0);
    entry(&mut img[efi + 32..], b"..         ", 0x10, 0, 0);
    entry(&mut img[efi + 64..], b"BOOT       ", 0x10, 3, 0);
    let boot = cluster_at(3);
    entry(&mut img[boot..], b".          ", 0x10, 3, 0);
    entry(&mut img[boot + 32..], b"..         ", 0x10, 2, 0);
    entry(
        &mut img[boot + 64..],
        b"BOOTX64 EFI",
        0x20,
        4,
        data.len() as u32,
    );
    let f = cluster_at(4);
    img[f..f + data.len()].copy_from_slice(data);
    Ok(img)
}

fn boot_sector(s: &mut [u8], total: u16, fat_sectors: u16) {
    s[0..3].copy_from_slice(&[0xEB, 0x3C, 0x90]);
    s[3..11].copy_from_slice(b"BOOTPLAN");
    s[11..13].copy_from_slice(&(SECTOR as u16).to_le_bytes());
    s[13] = PER_CLUSTER as u8;
    s[14..16].copy_from_slice(&1u16.to_le_bytes());
    s[16] = 2;
    s[17..19].copy_from_slice(&(ROOT_ENTRIES as u16).to_le_bytes());
    s[19..21].copy_from_slice(&total.to_le_bytes());
    s[21] = 0xF8;
    s[22..24].copy_from_slice(&fat_sectors.to_le_bytes());
    s[24..26].copy_from_slice(&32u16.to_le_bytes());
    s[26..28].copy_from_slice(&64u16.to_le_bytes());
    s[36] = 0x80;
    s[38] = 0x29;
    s[39..43].copy_from_slice(&0x6270_6c6eu32.to_le_bytes());
    // No label (a label here wants a matching root directory entry, says fsck.fat).
    s[43..54].copy_from_slice(b"NO NAME    ");
    s[54..62].copy_from_slice(b"FAT12   ");
    s[510] = 0x55;
    s[511] = 0xAA;
}

/// One 32-byte directory entry (8.3 name padded with spaces, no timestamps).
fn entry(d: &mut [u8], name: &[u8; 11], attr: u8, cluster: u16, size: u32) {
    d[..11].copy_from_slice(name);
    d[11] = attr;
    d[26..28].copy_from_slice(&cluster.to_le_bytes());
    d[28..32].copy_from_slice(&size.to_le_bytes());
}

/// FAT12 entry `n` (12 bits, two entries per three bytes).
fn set12(fat: &mut [u8], n: usize, v: u16) {
    let at = n * 3 / 2;
    let cur = u16::from_le_bytes([fat[at], fat[at + 1]]);
    let new = if n.is_multiple_of(2) {
        (cur & 0xF000) | (v & 0x0FFF)
    } else {
        (cur & 0x000F) | (v << 4)
    };
    fat[at..at + 2].copy_from_slice(&new.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// mtools (Debian `mtools`) reads the image back: the file is there, intact, and
    /// `fsck.fat` (Debian `dosfstools`) finds nothing to fix.
    #[test]
    fn mtools_reads_it_back_and_fsck_is_clean() {
        let data: Vec<u8> = (0..850_001u32).map(|i| (i * 7 % 251) as u8).collect();
        let img = esp_with_bootx64(&data).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("esp.img");
        std::fs::write(&p, &img).unwrap();
        let out = dir.path().join("out.efi");
        let o = Command::new("mcopy")
            .args(["-n", "-i", p.to_str().unwrap(), "::/EFI/BOOT/BOOTX64.EFI"])
            .arg(&out)
            .output()
            .expect("mcopy (apt-get install mtools)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(std::fs::read(&out).unwrap() == data);
        let o = Command::new("fsck.fat")
            .args(["-n", "-v", p.to_str().unwrap()])
            .output()
            .expect("fsck.fat (apt-get install dosfstools)");
        let t = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{t}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(t.contains("12 bit entries") && t.contains("3 files"), "{t}");
        assert_eq!(
            esp_with_bootx64(&vec![0; 9 << 20]).unwrap_err(),
            FatError::TooLarge(9 << 20)
        );
    }
}
