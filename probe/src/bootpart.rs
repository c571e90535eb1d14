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
/// EINVAL (a loop device without partition scanning) is not an error. Where the kernel
/// then shows none of the partitions the table lists (partition scanning off: a loop
/// device attached without it, some containers), they are added one by one
/// ([`add_partitions`], as `partx --add` does).
pub fn reread(disk: &Path) -> Result<(), String> {
    let f = File::open(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    let start = Instant::now();
    loop {
        // SAFETY: BLKRRPART takes no argument.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKRRPART as _, 0) } == 0 {
            return add_partitions(disk, &f);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => return add_partitions(disk, &f),
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

/// `BLKPG` (`_IO(0x12, 105)`) and its add operation.
const BLKPG: libc::c_ulong = 0x1269;
const BLKPG_ADD_PARTITION: libc::c_int = 1;

/// `struct blkpg_partition` (linux/blkpg.h): offsets and length in bytes.
#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

/// `struct blkpg_ioctl_arg`.
#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

/// When the kernel shows no partition of `disk` but its table lists some, add them with
/// `BLKPG_ADD_PARTITION` (numbered in table order); nothing when the kernel already
/// shows any.
fn add_partitions(disk: &Path, f: &File) -> Result<(), String> {
    let shown = sysfs_dir(disk)
        .ok()
        .and_then(|d| std::fs::read_dir(&d).ok().map(|r| (d, r)))
        .is_some_and(|(d, r)| {
            r.flatten()
                .any(|e| d.join(e.file_name()).join("partition").exists())
        });
    if shown {
        return Ok(());
    }
    let size = std::fs::File::open(disk)
        .and_then(|mut g| g.seek(SeekFrom::End(0)))
        .map_err(|e| format!("{}: {e}", disk.display()))?;
    let read = |off: u64, len: u64| -> Result<Vec<u8>, String> {
        let mut g = File::open(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
        g.seek(SeekFrom::Start(off)).map_err(|e| e.to_string())?;
        let mut b = vec![0u8; len as usize];
        g.read_exact(&mut b)
            .map_err(|e| format!("{}: {e}", disk.display()))?;
        Ok(b)
    };
    let w = crate::parttable::WINDOW.min(size);
    let table = crate::parttable::parse(&read(0, w)?, &read(size - w, w)?, size);
    for (i, p) in table.parts.iter().enumerate() {
        let mut part = BlkpgPartition {
            start: p.start as libc::c_longlong,
            length: p.len as libc::c_longlong,
            pno: (i + 1) as libc::c_int,
            devname: [0; 64],
            volname: [0; 64],
        };
        let mut arg = BlkpgIoctlArg {
            op: BLKPG_ADD_PARTITION,
            flags: 0,
            datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
            data: (&mut part as *mut BlkpgPartition).cast(),
        };
        // SAFETY: BLKPG reads `arg` and the partition it points to, both alive here.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKPG as _, &mut arg) } != 0 {
            let e = std::io::Error::last_os_error();
            // EBUSY: the kernel has that partition already.
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(format!(
                    "adding partition {} of {}: {e}",
                    i + 1,
                    disk.display()
                ));
            }
        }
    }
    Ok(())
}

/// `disk`'s directory in sysfs.
fn sysfs_dir(disk: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    let rdev = meta.rdev();
    let link = format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev));
    std::fs::canonicalize(&link).map_err(|e| format!("{link}: {e}"))
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

/// The partition numbers (1-based) whose GPT type is the ESP, from the disk's primary
/// GPT (`sector`-byte LBAs); empty without one.
fn esp_numbers(disk: &Path, sector: u64) -> Vec<u32> {
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
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let lba = u64::from_le_bytes(h[72..80].try_into().unwrap_or_default());
    let (count, size) = (u32_at(80).min(128), u32_at(84));
    if !(128..=4096).contains(&size) {
        return Vec::new();
    }
    let Some(e) = read(lba.saturating_mul(sector), (count * size) as usize) else {
        return Vec::new();
    };
    (0..count)
        .filter(|i| e[(i * size) as usize..][..16] == ESP_TYPE)
        .map(|i| i + 1)
        .collect()
}

/// The partitions of `disk` (a whole block device), waiting up to [`SETTLE`] for their
/// device nodes.
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
    let esps = esp_numbers(disk, sector);
    let mut parts = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(&sysfs)
        .map_err(|e| format!("{}: {e}", sysfs.display()))?
        .flatten()
        .take(crate::collect::MAX_ENTRIES)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| sysfs.join(n).join("partition").exists())
        .collect();
    names.sort();
    for n in names {
        let d = sysfs.join(&n);
        let number = attr(&d.join("partition"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let uevent = std::fs::read_to_string(d.join("uevent")).unwrap_or_default();
        let partname = uevent
            .lines()
            .find_map(|l| l.strip_prefix("PARTNAME="))
            .map(str::to_string);
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
            esp: esps.contains(&number),
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
