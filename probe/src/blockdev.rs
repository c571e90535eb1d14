//! The devices `bootplane probe wipe` works on: finding them (`--all`: whole disks in
//! `/sys/block`), refusing the ones in use (mounted, swap, held by dm/md, a loop device's
//! backing file), opening them for writing (a read-only device is named as such), and
//! the block I/O the policies need: aligned `O_DIRECT` zero writes and read-back checks,
//! `BLKDISCARD`, `BLKZEROOUT`, `BLKRRPART`, and `fallocate` hole punching for files.
//!
//! The `ioctl` numbers are the generic Linux encodings (x86_64, aarch64, s390x, riscv64).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::collect::{attr, read_capped, MAX_FILE};
use crate::parttable::Range;

const BLKROGET: libc::c_ulong = 0x125e;
const BLKRRPART: libc::c_ulong = 0x125f;
const BLKFLSBUF: libc::c_ulong = 0x1261;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// Size of the aligned zero and read buffers.
pub const BUF: usize = 4 << 20;

/// Kernel names in `/sys/block` that are never a disk to wipe.
const NOT_DISKS: &[&str] = &["loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"];

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A block device: its sysfs directory (`/sys/dev/block/M:m`, resolved) and name.
    Block { sysfs: PathBuf, name: String },
    /// A regular file (a disk image).
    File,
}

/// A device checked for use, before anything is opened for writing.
#[derive(Debug, Clone)]
pub struct Checked {
    pub path: PathBuf,
    pub kind: Kind,
    pub serial: Option<String>,
    /// The size sysfs or the file system reports (the report's size when the device
    /// cannot be opened for writing).
    pub size_hint: u64,
}

/// Whole disks in `/sys/block` worth wiping: no loop, ram, zram, optical, md or dm
/// devices, nothing removable, nothing of size 0. Device paths `/dev/NAME`.
pub fn all_disks(sys_block: &Path) -> Vec<PathBuf> {
    let mut names: Vec<String> = std::fs::read_dir(sys_block)
        .map(|d| {
            d.flatten()
                .take(crate::collect::MAX_ENTRIES)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
        .filter(|n| {
            let d = sys_block.join(n);
            attr(&d.join("removable")).as_deref() != Some("1")
                && attr(&d.join("size")).is_some_and(|s| s != "0")
        })
        .map(|n| PathBuf::from("/dev").join(n.replace('!', "/")))
        .collect()
}

/// `(major, minor)` of a `dev` attribute (`"259:0"`).
fn devno(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Names of the entries of a sysfs directory (capped).
fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .take(crate::collect::MAX_ENTRIES)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Check `path` before anything is written: it exists, is a block device or a regular
/// file, and neither it nor a partition of it is mounted, used as swap, held by another
/// device (dm, md, LVM) or, for a file, backing a loop device. The error is the refusal.
pub fn check(path: &Path) -> Result<Checked, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let ft = meta.file_type();
    if ft.is_file() {
        let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(l) = loop_backed_by(&real) {
            return Err(format!("{}: backs loop device {l}", path.display()));
        }
        return Ok(Checked {
            path: path.to_path_buf(),
            kind: Kind::File,
            serial: None,
            size_hint: meta.len(),
        });
    }
    if !ft.is_block_device() {
        return Err(format!(
            "{}: not a block device or a regular file",
            path.display()
        ));
    }
    let rdev = meta.rdev();
    let (maj, min) = (libc::major(rdev) as u64, libc::minor(rdev) as u64);
    let link = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    let sysfs = std::fs::canonicalize(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    let name = sysfs
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The device and its partitions (subdirectories with a `partition` attribute).
    let mut devs = vec![((maj, min), name.clone(), sysfs.clone())];
    for n in names(&sysfs) {
        let d = sysfs.join(&n);
        if d.join("partition").exists() {
            if let Some(no) = attr(&d.join("dev")).and_then(|s| devno(&s)) {
                devs.push((no, n, d));
            }
        }
    }
    let mounts = mounted_devices();
    let swaps = swap_devices();
    for (no, n, d) in &devs {
        let held = names(&d.join("holders"));
        if !held.is_empty() {
            return Err(format!(
                "{}: {n} is held by {} (device mapper, md or lvm)",
                path.display(),
                held.join(", ")
            ));
        }
        let dev_path = format!("/dev/{}", n.replace('!', "/"));
        if let Some(m) = mounts
            .iter()
            .find(|(mno, src, _)| mno == no || *src == dev_path)
        {
            return Err(format!("{}: {n} is mounted on {}", path.display(), m.2));
        }
        if swaps.contains(&dev_path) {
            return Err(format!("{}: {n} is in use as swap", path.display()));
        }
    }
    let serial = crate::collect::disk_serial(&sysfs);
    let size_hint = attr(&sysfs.join("size"))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        .saturating_mul(512);
    Ok(Checked {
        path: path.to_path_buf(),
        kind: Kind::Block { sysfs, name },
        serial,
        size_hint,
    })
}

/// Every mount of `/proc/self/mountinfo`: (device number, source, mount point).
fn mounted_devices() -> Vec<((u64, u64), String, String)> {
    let raw = read_capped(Path::new("/proc/self/mountinfo"), MAX_FILE).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let no = devno(f.get(2)?)?;
            let dash = f.iter().position(|x| *x == "-")?;
            let src = f.get(dash + 2).copied().unwrap_or("");
            Some((no, src.to_string(), f.get(4)?.to_string()))
        })
        .collect()
}

/// Device paths of `/proc/swaps`.
fn swap_devices() -> Vec<String> {
    let raw = read_capped(Path::new("/proc/swaps"), MAX_FILE).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The loop device whose backing file is `file`, if any.
fn loop_backed_by(file: &Path) -> Option<String> {
    names(Path::new("/sys/block"))
        .into_iter()
        .filter(|n| n.starts_with("loop"))
        .find(|n| {
            attr(&Path::new("/sys/block").join(n).join("loop/backing_file"))
                .is_some_and(|b| Path::new(&b) == file)
        })
        .map(|n| format!("/dev/{n}"))
}

/// An aligned, zeroed buffer for `O_DIRECT` I/O.
pub struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is owned memory; nothing else aliases it.
unsafe impl Send for Aligned {}

impl Aligned {
    pub fn zeroed(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096)
            .expect("buffer size and alignment are valid");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Aligned {
            ptr,
            len: len.max(4096),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as bytes, and &mut self makes it unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096)
            .expect("the layout it was allocated with");
        // SAFETY: allocated in zeroed() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// A device open for writing.
pub struct Dev {
    pub checked: Checked,
    pub size: u64,
    /// Logical block size (512 for files).
    pub sector: u64,
    file: File,
    /// The same device opened with `O_DIRECT` (None where the file system refuses it).
    direct: Option<File>,
}

fn ioctl_u64(f: &File, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: req is a BLK* ioctl that writes one u64 (or a smaller int, zero-extended)
    // into v, which outlives the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), req as _, &mut v as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_range(f: &File, req: libc::c_ulong, r: Range) -> io::Result<()> {
    let arg: [u64; 2] = [r.start, r.len()];
    // SAFETY: BLKDISCARD and BLKZEROOUT read two u64s (start, length) from arg.
    if unsafe { libc::ioctl(f.as_raw_fd(), req as _, arg.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a failed open for writing means the device is read-only: EROFS, or EACCES
/// for root (whom permissions do not stop: a read-only loop device answers EACCES).
fn read_only(e: &io::Error) -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    match e.raw_os_error() {
        Some(libc::EROFS) => true,
        Some(libc::EACCES) => root,
        _ => false,
    }
}

/// Open a checked device for reading and writing. A device the kernel reports
/// read-only (`BLKROGET`, or an open for writing failing with EROFS/EACCES) is an
/// error saying so.
pub fn open(c: Checked) -> Result<Dev, String> {
    let p = &c.path;
    let block = matches!(c.kind, Kind::Block { .. });
    let flags = if block { libc::O_EXCL } else { 0 };
    if block {
        let ro = File::open(p).map_err(|e| format!("opening {}: {e}", p.display()))?;
        if ioctl_u64(&ro, BLKROGET).is_ok_and(|v| v as u32 != 0) {
            return Err("device is read-only".into());
        }
    }
    let rw = |extra: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags | extra)
            .open(p)
    };
    let file = rw(0).map_err(|e| match e.raw_os_error() {
        _ if read_only(&e) => format!("device is read-only ({e})"),
        Some(libc::EBUSY) => format!("{} is in use (open O_EXCL: {e})", p.display()),
        _ => format!("opening {} for writing: {e}", p.display()),
    })?;
    // Only one O_EXCL opener of a block device: the direct one is opened without it,
    // while the first holds the claim.
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .ok();
    let (size, sector) = if block {
        let size =
            ioctl_u64(&file, BLKGETSIZE64).map_err(|e| format!("size of {}: {e}", p.display()))?;
        let sector = ioctl_u64(&file, BLKSSZGET)
            .map(|s| s as u32 as u64)
            .unwrap_or(512);
        (size, sector.clamp(512, 65536))
    } else {
        let m = file
            .metadata()
            .map_err(|e| format!("{}: {e}", p.display()))?;
        (m.len(), 512)
    };
    Ok(Dev {
        checked: c,
        size,
        sector,
        file,
        direct,
    })
}

impl Dev {
    pub fn is_block(&self) -> bool {
        matches!(self.checked.kind, Kind::Block { .. })
    }

    /// The file to use for `len` bytes at `off`: the `O_DIRECT` one when both are
    /// aligned (and the buffer is), else the buffered one.
    fn pick(&self, off: u64, len: u64) -> &File {
        let a = self.sector.max(512);
        match &self.direct {
            Some(d) if off.is_multiple_of(a) && len.is_multiple_of(a) => d,
            _ => &self.file,
        }
    }

    /// Write zeros over `r` in [`BUF`] pieces; `tick` hears the bytes done so far and
    /// may stop the write (deadline). Returns the bytes written.
    pub fn write_zeros(
        &self,
        r: Range,
        zeros: &Aligned,
        tick: &mut dyn FnMut(u64) -> Result<(), String>,
    ) -> Result<u64, String> {
        let mut off = r.start;
        while off < r.end {
            let n = (r.end - off).min(zeros.len as u64);
            self.pick(off, n)
                .write_all_at(&zeros.bytes()[..n as usize], off)
                .map_err(|e| format!("writing at {off}: {e}"))?;
            off += n;
            tick(off - r.start)?;
        }
        Ok(r.len())
    }

    /// Flush everything written to stable storage.
    pub fn sync(&self) -> Result<(), String> {
        for f in std::iter::once(&self.file).chain(self.direct.as_ref()) {
            f.sync_all().map_err(|e| format!("fsync: {e}"))?;
        }
        Ok(())
    }

    /// Read `r` back and return the offset of its first non-zero byte, if any. Reads
    /// with `O_DIRECT` where the device allows (the page cache is never what is checked
    /// on a block device: without `O_DIRECT` it is dropped first with `BLKFLSBUF`).
    pub fn first_nonzero(
        &self,
        r: Range,
        buf: &mut Aligned,
        tick: &mut dyn FnMut(u64) -> Result<(), String>,
    ) -> Result<Option<u64>, String> {
        let mut off = r.start;
        while off < r.end {
            let want = (r.end - off).min(buf.len as u64);
            // A short tail (a file whose size is not a multiple of the sector): read a
            // whole sector's worth through the buffered file.
            let f = self.pick(off, want);
            let got = f
                .read_at(&mut buf.bytes_mut()[..want as usize], off)
                .map_err(|e| format!("reading at {off}: {e}"))?;
            if got == 0 {
                return Err(format!("device ended at {off}, before {}", r.end));
            }
            if let Some(i) = nonzero(&buf.bytes()[..got]) {
                return Ok(Some(off + i as u64));
            }
            off += got as u64;
            tick(off - r.start)?;
        }
        Ok(None)
    }

    /// Read up to `r.len()` bytes at `r.start` into `buf` (at least that large); the
    /// bytes read (fewer at the end of a file).
    pub fn read_into(&self, r: Range, buf: &mut Aligned) -> Result<usize, String> {
        let want = (r.len() as usize).min(buf.len);
        let mut got = 0;
        while got < want {
            let off = r.start + got as u64;
            let f = self.pick(off, (want - got) as u64);
            let n = f
                .read_at(&mut buf.bytes_mut()[got..want], off)
                .map_err(|e| format!("reading at {off}: {e}"))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }

    /// Drop the block device's page cache (`BLKFLSBUF`), so buffered reads go to it.
    pub fn drop_cache(&self) {
        if self.is_block() {
            // SAFETY: BLKFLSBUF takes no argument.
            unsafe { libc::ioctl(self.file.as_raw_fd(), BLKFLSBUF as _, 0) };
        } else {
            // SAFETY: fadvise takes only the descriptor and a range.
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }

    /// Whether reads can bypass the page cache.
    pub fn has_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// `BLKDISCARD` over `r`.
    pub fn discard(&self, r: Range) -> io::Result<()> {
        ioctl_range(&self.file, BLKDISCARD, r)
    }

    /// `BLKZEROOUT` over `r`.
    pub fn zeroout(&self, r: Range) -> io::Result<()> {
        ioctl_range(&self.file, BLKZEROOUT, r)
    }

    /// Punch a hole over the whole file (its size kept).
    pub fn punch_hole(&self) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate takes the descriptor, a mode and a range only.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), mode, 0, self.size as i64) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Ask the kernel to read the partition table again (`BLKRRPART`); EINVAL (a loop
    /// device without partition scanning, a partition) is not an error.
    pub fn reread_partitions(&self) -> Result<(), String> {
        if !self.is_block() {
            return Ok(());
        }
        // SAFETY: BLKRRPART takes no argument.
        if unsafe { libc::ioctl(self.file.as_raw_fd(), BLKRRPART as _, 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(format!("re-reading the partition table: {e}"));
            }
        }
        Ok(())
    }

    /// The buffered file (for the NVMe ioctls).
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// The index of the first non-zero byte of `b`, looking at 8 bytes at a time.
pub fn nonzero(b: &[u8]) -> Option<usize> {
    let mut chunks = b.chunks_exact(64);
    let mut at = 0;
    for c in &mut chunks {
        let mut acc = 0u64;
        for w in c.chunks_exact(8) {
            acc |= u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        }
        if acc != 0 {
            return c.iter().position(|&x| x != 0).map(|i| at + i);
        }
        at += 64;
    }
    chunks
        .remainder()
        .iter()
        .position(|&x| x != 0)
        .map(|i| at + i)
}

/// The whole-disk name of a block device's sysfs directory when it is an NVMe namespace
/// (`nvme0n1`, not `nvme0n1p1`).
pub fn nvme_namespace(k: &Kind) -> Option<&str> {
    let Kind::Block { name, .. } = k else {
        return None;
    };
    let rest = name.strip_prefix("nvme")?;
    let (ctrl, ns) = rest.split_once('n')?;
    (!ctrl.is_empty()
        && ctrl.bytes().all(|b| b.is_ascii_digit())
        && !ns.is_empty()
        && ns.bytes().all(|b| b.is_ascii_digit()))
    .then_some(name.as_str())
}
