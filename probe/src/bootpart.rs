//! The installed system's boot partition, and writing the Ignition config into it as
//! coreos-installer does: after the image is on the disk, the kernel re-reads the
//! partition table (`BLKRRPART`), the partition to write to is the one whose GPT
//! partition name is `boot`, else the one whose file system label is `boot` (ext4 or
//! vfat, read from its superblock), else the EFI system partition (by its GPT type); it
//! is mounted (`nosuid,nodev,noexec`) on a new directory only root can enter (`mkdtemp`,
//! 0700), `ignition/` (0700) and `ignition/config.ign` (0600) are written and fsynced,
//! and it is unmounted again. The installed system's Ignition reads that file on its
//! first boot (the `file` provider of CoreOS-style images; see docs/install.md).
//!
//! Reading the labels and the GPT entries is done here on the bytes (no `blkid` in the
//! agent); what is read is bounded (the first 64 KiB of a partition, 128 GPT entries).
//! When the kernel shows no partition after `BLKRRPART` but the disk has a GPT (a kernel
//! without GPT support, as some minimal VM kernels are), the partitions are added from
//! it with `BLKPG`, as `partx --add` does.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::collect::attr;

const BLKRRPART: libc::c_ulong = 0x125f;
/// The EFI system partition's GPT type GUID (C12A7328-F81F-11D2-BA4B-00A0C93EC93B) as
/// stored on disk (the first three fields little-endian).
const ESP_TYPE: [u8; 16] = [
    0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9, 0x3b,
];
/// Where the config goes inside the boot file system (coreos-installer's path).
pub const CONFIG_PATH: &str = "ignition/config.ign";
/// How long partition device nodes may take to appear after `BLKRRPART`.
const SETTLE: Duration = Duration::from_secs(10);

/// A partition of the installed disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `/dev/sda3`.
    pub dev: String,
    pub number: u32,
    /// GPT partition name (`PARTNAME` in sysfs), if any.
    pub partname: Option<String>,
    /// `ext4` or `vfat`, when recognised.
    pub fstype: Option<&'static str>,
    pub label: Option<String>,
    pub esp: bool,
}

impl Partition {
    fn describe(&self) -> String {
        format!(
            "{} (partname {:?}, {} label {:?}{})",
            self.dev,
            self.partname.as_deref().unwrap_or(""),
            self.fstype.unwrap_or("unknown fs"),
            self.label.as_deref().unwrap_or(""),
            if self.esp { ", esp" } else { "" }
        )
    }
}

/// Ask the kernel to re-read `disk`'s partition table, retrying while it is busy;
/// EINVAL (a loop device without partition scanning) is not an error.
pub fn reread(disk: &Path) -> Result<(), String> {
    let f = File::open(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    let start = Instant::now();
    loop {
        // SAFETY: BLKRRPART takes no argument.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKRRPART as _, 0) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => return Ok(()),
            Some(libc::EBUSY) if start.elapsed() < SETTLE => {
                std::thread::sleep(Duration::from_millis(200))
            }
            _ => {
                return Err(format!(
                    "re-reading the partition table of {}: {e}",
                    disk.display()
                ))
            }
        }
    }
}

/// The file system type and label in the first bytes of a partition.
pub fn fs_label(head: &[u8]) -> Option<(&'static str, Option<String>)> {
    let text = |b: &[u8]| {
        let s = String::from_utf8_lossy(b)
            .trim_end_matches(['\0', ' '])
            .to_string();
        (!s.is_empty() && s != "NO NAME").then_some(s)
    };
    // ext2/3/4: superblock at 1024, magic 0xEF53 at +56, volume name (16 bytes) at +120.
    if head.len() >= 1024 + 136 && head[1024 + 56..1024 + 58] == [0x53, 0xef] {
        return Some(("ext4", text(&head[1024 + 120..1024 + 136])));
    }
    if head.len() >= 512 && head[510..512] == [0x55, 0xaa] {
        // FAT32: "FAT32" at 82, label at 71; FAT12/16: "FAT" at 54, label at 43.
        if &head[82..87] == b"FAT32" {
            return Some(("vfat", text(&head[71..82])));
        }
        if &head[54..57] == b"FAT" {
            return Some(("vfat", text(&head[43..54])));
        }
    }
    None
}

/// A used entry of the disk's primary GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptEntry {
    /// 1-based, the kernel's partition number.
    pub number: u32,
    pub esp: bool,
    /// The partition name (UTF-16LE in the entry).
    pub name: String,
    /// In bytes.
    pub start: u64,
    pub len: u64,
}

/// The used entries of `disk`'s primary GPT (`sector`-byte LBAs); empty without one.
/// Bounded: at most 128 entries of 128..=4096 bytes.
pub fn gpt_entries(disk: &Path, sector: u64) -> Vec<GptEntry> {
    let read = |off: u64, len: usize| -> Option<Vec<u8>> {
        let mut f = File::open(disk).ok()?;
        f.seek(SeekFrom::Start(off)).ok()?;
        let mut b = vec![0u8; len];
        f.read_exact(&mut b).ok()?;
        Some(b)
    };
    let Some(h) = read(sector, 92) else {
        return Vec::new();
    };
    if &h[..8] != b"EFI PART" {
        return Vec::new();
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let lba = u64_at(&h, 72);
    let (count, size) = (u32_at(&h, 80).min(128), u32_at(&h, 84));
    if !(128..=4096).contains(&size) {
        return Vec::new();
    }
    let Some(e) = read(lba.saturating_mul(sector), (count * size) as usize) else {
        return Vec::new();
    };
    (0..count)
        .filter_map(|i| {
            let b = &e[(i * size) as usize..][..128];
            if b[..16].iter().all(|&x| x == 0) {
                return None;
            }
            let (first, last) = (u64_at(b, 32), u64_at(b, 40));
            let units: Vec<u16> = b[56..128]
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .take_while(|&u| u != 0)
                .collect();
            Some(GptEntry {
                number: i + 1,
                esp: b[..16] == ESP_TYPE,
                name: String::from_utf16_lossy(&units),
                start: first.checked_mul(sector)?,
                len: last
                    .checked_sub(first)?
                    .checked_add(1)?
                    .checked_mul(sector)?,
            })
        })
        .collect()
}

/// `struct blkpg_partition` of <linux/blkpg.h>.
#[repr(C)]
struct BlkpgPartition {
    start: i64,
    length: i64,
    pno: libc::c_int,
    devname: [u8; 64],
    volname: [u8; 64],
}

/// `struct blkpg_ioctl_arg` of <linux/blkpg.h>.
#[repr(C)]
struct BlkpgArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut BlkpgPartition,
}

const BLKPG: libc::c_ulong = 0x1269;
const BLKPG_ADD_PARTITION: libc::c_int = 1;

/// Add `entries` as partitions of `disk` (`BLKPG_ADD_PARTITION`, what `partx --add`
/// does): for a kernel that did not read the GPT itself (one built without
/// `CONFIG_EFI_PARTITION`, a loop device whose scan found nothing).
fn add_partitions(disk: &Path, entries: &[GptEntry]) -> Result<(), String> {
    let f = File::open(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    for e in entries {
        let mut p = BlkpgPartition {
            start: e.start as i64,
            length: e.len as i64,
            pno: e.number as libc::c_int,
            devname: [0; 64],
            volname: [0; 64],
        };
        let mut arg = BlkpgArg {
            op: BLKPG_ADD_PARTITION,
            flags: 0,
            datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
            data: &mut p,
        };
        // SAFETY: arg and the partition it points to live across the call, laid out as
        // <linux/blkpg.h> declares them.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKPG as _, &mut arg) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EBUSY) {
                return Err(format!(
                    "adding partition {} of {}: {err}",
                    e.number,
                    disk.display()
                ));
            }
        }
    }
    Ok(())
}

/// The names of `sysfs`'s partition subdirectories.
fn sysfs_partitions(sysfs: &Path) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = std::fs::read_dir(sysfs)
        .map_err(|e| format!("{}: {e}", sysfs.display()))?
        .flatten()
        .take(crate::collect::MAX_ENTRIES)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| sysfs.join(n).join("partition").exists())
        .collect();
    names.sort();
    Ok(names)
}

/// The partitions of `disk` (a whole block device), waiting up to [`SETTLE`] for their
/// device nodes; when the kernel shows none but the disk has a GPT, they are added
/// from it first.
pub fn partitions(disk: &Path) -> Result<Vec<Partition>, String> {
    let meta = std::fs::metadata(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    if !meta.file_type().is_block_device() {
        return Err(format!("{}: not a block device", disk.display()));
    }
    let rdev = meta.rdev();
    let link = format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev));
    let sysfs = std::fs::canonicalize(&link).map_err(|e| format!("{link}: {e}"))?;
    let sector = attr(&sysfs.join("queue/logical_block_size"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let gpt = gpt_entries(disk, sector);
    let mut names = sysfs_partitions(&sysfs)?;
    if names.is_empty() && !gpt.is_empty() {
        add_partitions(disk, &gpt)?;
        names = sysfs_partitions(&sysfs)?;
    }
    let mut parts = Vec::new();
    for n in names {
        let d = sysfs.join(&n);
        let number = attr(&d.join("partition"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let entry = gpt.iter().find(|e| e.number == number);
        let uevent = std::fs::read_to_string(d.join("uevent")).unwrap_or_default();
        let partname = entry
            .map(|e| e.name.clone())
            .filter(|n| !n.is_empty())
            .or_else(|| {
                uevent
                    .lines()
                    .find_map(|l| l.strip_prefix("PARTNAME="))
                    .map(str::to_string)
            });
        let dev = format!("/dev/{}", n.replace('!', "/"));
        let start = Instant::now();
        while !Path::new(&dev).exists() && start.elapsed() < SETTLE {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut head = vec![0u8; 64 << 10];
        let got = File::open(&dev)
            .and_then(|mut f| f.read(&mut head))
            .map_err(|e| format!("reading {dev}: {e}"))?;
        let (fstype, label) = match fs_label(&head[..got]) {
            Some((t, l)) => (Some(t), l),
            None => (None, None),
        };
        parts.push(Partition {
            dev,
            number,
            partname,
            fstype,
            label,
            esp: entry.is_some_and(|e| e.esp),
        });
    }
    Ok(parts)
}

/// The partition to write the config to and how it was found: GPT name `boot`, file
/// system label `boot`, the ESP; the error names the partitions found.
pub fn pick(parts: &[Partition]) -> Result<(&Partition, &'static str), String> {
    let by = |f: &dyn Fn(&Partition) -> bool| parts.iter().find(|p| p.fstype.is_some() && f(p));
    if let Some(p) = by(&|p| p.partname.as_deref() == Some("boot")) {
        return Ok((p, "partlabel boot"));
    }
    if let Some(p) = by(&|p| p.label.as_deref() == Some("boot")) {
        return Ok((p, "label boot"));
    }
    if let Some(p) = by(&|p| p.esp) {
        return Ok((p, "esp"));
    }
    let found: Vec<String> = parts.iter().map(Partition::describe).collect();
    Err(format!(
        "no boot partition (gpt name or ext4/vfat label \"boot\", or an esp) among the {} partitions found: {}",
        parts.len(),
        if found.is_empty() { "none".into() } else { found.join("; ") }
    ))
}

/// A file system mounted on a new private directory, unmounted (and the directory
/// removed) on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn new(dev: &str, fstype: &str) -> Result<Mounted, String> {
        let mut tmpl = std::env::temp_dir()
            .join("bootplane-install-XXXXXX")
            .into_os_string()
            .into_encoded_bytes();
        tmpl.push(0);
        // SAFETY: tmpl is a writable NUL-terminated buffer ending in XXXXXX.
        let p = unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) };
        if p.is_null() {
            return Err(format!("mkdtemp: {}", std::io::Error::last_os_error()));
        }
        tmpl.pop();
        let dir = PathBuf::from(String::from_utf8_lossy(&tmpl).into_owned());
        let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?}: contains a nul byte"));
        let (src, dst, ty) = (c(dev)?, c(&dir.to_string_lossy())?, c(fstype)?);
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        // SAFETY: NUL-terminated strings that outlive the call; no data argument.
        if unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                ty.as_ptr(),
                flags,
                std::ptr::null(),
            )
        } != 0
        {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_dir(&dir);
            return Err(format!(
                "mounting {dev} ({fstype}) on {}: {e}",
                dir.display()
            ));
        }
        Ok(Mounted(dir))
    }

    fn unmount(self) -> Result<(), String> {
        let dst = CString::new(self.0.to_string_lossy().as_bytes()).unwrap_or_default();
        // SAFETY: a NUL-terminated path.
        let r = unsafe { libc::umount2(dst.as_ptr(), 0) };
        let e = std::io::Error::last_os_error();
        let dir = self.0.clone();
        std::mem::forget(self);
        if r != 0 {
            return Err(format!("unmounting {}: {e}", dir.display()));
        }
        let _ = std::fs::remove_dir(&dir);
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let dst = CString::new(self.0.to_string_lossy().as_bytes()).unwrap_or_default();
        // SAFETY: a NUL-terminated path; best effort on an error path.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Write `config` as `ignition/config.ign` (0600, in a 0700 directory, fsynced) into
/// `part`'s file system.
pub fn write_config(part: &Partition, config: &[u8]) -> Result<(), String> {
    let fstype = part
        .fstype
        .ok_or_else(|| format!("{}: unknown file system", part.dev))?;
    let m = Mounted::new(&part.dev, fstype)?;
    let dir = m.0.join("ignition");
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io("creating", &dir, e))?;
    }
    let path = dir.join("config.ign");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| io("creating", &path, e))?;
    // vfat has no modes; on ext4 an existing file keeps its mode unless set again.
    if fstype == "ext4" {
        use std::os::unix::fs::PermissionsExt as _;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io("chmod", &path, e))?;
    }
    f.write_all(config).map_err(|e| io("writing", &path, e))?;
    f.sync_all().map_err(|e| io("syncing", &path, e))?;
    drop(f);
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing", &dir, e))?;
    m.unmount()
}
