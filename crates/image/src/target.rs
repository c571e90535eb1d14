//! The write target: a block device or a regular file, written with O_DIRECT.
//!
//! Opening refuses a block device that is mounted (or has a mounted partition, per
//! /proc/self/mountinfo), has holders (device-mapper, md), or is held open exclusively
//! by someone else (O_EXCL gives EBUSY); a regular file is locked with `flock`. An
//! existing non-empty file or a device has a fixed size and must be at least as large as
//! the image; a new or empty file is grown to the image size. Buffers are aligned to
//! 4096 bytes, which covers both 512-byte and 4 KiB logical blocks.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{PResult, ProvisionError};

pub(crate) const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`].
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: the buffer is uniquely owned plain memory.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, cap }
    }
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.cap) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.cap, ALIGN)) }
    }
}

/// A free list of equal-sized aligned buffers, so the copy does not page-fault fresh
/// memory for every frame. Buffers return to it when the last [`PooledBuf`] drops.
#[derive(Clone)]
pub struct Pool {
    free: Arc<Mutex<Vec<AlignedBuf>>>,
    size: usize,
}

impl Pool {
    pub(crate) fn new(size: usize) -> Self {
        Pool {
            free: Arc::new(Mutex::new(Vec::new())),
            size,
        }
    }
    pub(crate) fn get(&self) -> PooledBuf {
        let b = self
            .free
            .lock()
            .ok()
            .and_then(|mut f| f.pop())
            .unwrap_or_else(|| AlignedBuf::new(self.size));
        PooledBuf {
            buf: Some(b),
            pool: self.free.clone(),
        }
    }
}

pub(crate) struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: Arc<Mutex<Vec<AlignedBuf>>>,
}

impl std::ops::Deref for PooledBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("pooled buffer present until drop")
    }
}
impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("pooled buffer present until drop")
    }
}
impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let (Some(b), Ok(mut f)) = (self.buf.take(), self.pool.lock()) {
            if f.len() < 64 {
                f.push(b);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetKind {
    Block,
    /// A regular file; `fresh` when it was new or empty (so it is sized to the image).
    File {
        fresh: bool,
    },
}

pub(crate) struct Target {
    pub file: File,
    pub path: PathBuf,
    pub kind: TargetKind,
    /// Usable size in bytes (`u64::MAX` for a fresh file).
    pub size: u64,
    /// Logical block size: writes are multiples of it at multiples of it.
    pub block: usize,
    /// Whether O_DIRECT is in effect (tmpfs and some filesystems refuse it).
    pub direct: bool,
}

nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
nix::ioctl_read_bad!(blksszget, 0x1268, libc::c_int);
nix::ioctl_write_ptr!(blkzeroout, 0x12, 127, [u64; 2]);

fn dev_id(rdev: u64) -> (u64, u64) {
    (libc::major(rdev) as u64, libc::minor(rdev) as u64)
}

/// Devices (major, minor) that are the target or one of its partitions.
fn device_family(rdev: u64) -> Vec<(u64, u64)> {
    let (ma, mi) = dev_id(rdev);
    let mut v = vec![(ma, mi)];
    let sys = PathBuf::from(format!("/sys/dev/block/{ma}:{mi}"));
    if let Ok(rd) = std::fs::read_dir(&sys) {
        for e in rd.flatten() {
            let p = e.path();
            if p.join("partition").exists() {
                if let Ok(d) = std::fs::read_to_string(p.join("dev")) {
                    if let Some((a, b)) = d.trim().split_once(':') {
                        if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                            v.push((a, b));
                        }
                    }
                }
            }
        }
    }
    v
}

/// Mount points (from a mountinfo text) of any of `devs`.
pub(crate) fn mounted_on(mountinfo: &str, devs: &[(u64, u64)]) -> Option<String> {
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        if let Some((a, b)) = f[2].split_once(':') {
            if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
                if devs.contains(&(a, b)) {
                    return Some(f[4].to_string());
                }
            }
        }
    }
    None
}

fn holders(rdev: u64) -> Vec<String> {
    let (ma, mi) = dev_id(rdev);
    std::fs::read_dir(format!("/sys/dev/block/{ma}:{mi}/holders"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> ProvisionError {
    ProvisionError::TargetIo(format!("{what} {}: {e}", path.display()))
}

impl Target {
    /// Open and check the target. `raw_size` is the image size when known.
    #[cfg(test)]
    pub fn open(path: &Path, raw_size: Option<u64>) -> PResult<Target> {
        Target::open_with(path, raw_size, false)
    }

    /// [`Target::open`]; with `no_follow` a target that is a symbolic link is refused
    /// (it is opened with `O_NOFOLLOW`): the job runner passes the path it resolved and
    /// checked, and nothing may have put a link there since.
    pub(crate) fn open_with(
        path: &Path,
        raw_size: Option<u64>,
        no_follow: bool,
    ) -> PResult<Target> {
        let md = if no_follow {
            std::fs::symlink_metadata(path)
        } else {
            std::fs::metadata(path)
        };
        let nofollow = if no_follow { libc::O_NOFOLLOW } else { 0 };
        let is_block = md
            .as_ref()
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if let Ok(m) = &md {
            if !is_block && !m.file_type().is_file() {
                return Err(ProvisionError::Usage(format!(
                    "{} is neither a block device nor a regular file",
                    path.display()
                )));
            }
        }
        let t = if is_block {
            let rdev = md.as_ref().map(|m| m.rdev()).unwrap_or(0);
            let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            if let Some(mp) = mounted_on(&mi, &device_family(rdev)) {
                return Err(ProvisionError::TargetBusy(format!(
                    "{} (or a partition of it) is mounted on {mp}",
                    path.display()
                )));
            }
            let h = holders(rdev);
            if !h.is_empty() {
                return Err(ProvisionError::TargetBusy(format!(
                    "{} is held by {}",
                    path.display(),
                    h.join(", ")
                )));
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_EXCL | libc::O_DIRECT | nofollow)
                .open(path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::EBUSY) {
                        ProvisionError::TargetBusy(format!(
                            "{} is in use (opened exclusively elsewhere or mounted)",
                            path.display()
                        ))
                    } else {
                        io_err("opening", path, e)
                    }
                })?;
            let mut size = 0u64;
            let mut bs: libc::c_int = 0;
            // SAFETY: valid fd and out-pointers of the sizes the ioctls expect.
            unsafe {
                blkgetsize64(file.as_raw_fd(), &mut size).map_err(|e| io_err("sizing", path, e))?;
                blksszget(file.as_raw_fd(), &mut bs)
                    .map_err(|e| io_err("reading block size of", path, e))?;
            }
            let block = if bs > 0 && (bs as usize) <= ALIGN {
                bs as usize
            } else {
                512
            };
            Target {
                file,
                path: path.to_path_buf(),
                kind: TargetKind::Block,
                size,
                block,
                direct: true,
            }
        } else {
            let open = |direct: bool| {
                let mut o = OpenOptions::new();
                o.read(true).write(true).create(true);
                o.custom_flags(if direct { libc::O_DIRECT } else { 0 } | nofollow);
                o.open(path)
            };
            let (file, direct) = match open(true) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (open(false).map_err(|e| io_err("opening", path, e))?, false)
                }
                Err(e) => return Err(io_err("opening", path, e)),
            };
            // SAFETY: flock on a valid fd.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                return Err(ProvisionError::TargetBusy(format!(
                    "{} is locked by another writer",
                    path.display()
                )));
            }
            let len = file.metadata().map_err(|e| io_err("stat", path, e))?.len();
            let fresh = len == 0;
            Target {
                file,
                path: path.to_path_buf(),
                kind: TargetKind::File { fresh },
                size: if fresh { u64::MAX } else { len },
                block: ALIGN,
                direct,
            }
        };
        if let Some(r) = raw_size {
            t.check_fits(r)?;
        }
        Ok(t)
    }

    /// Treat a file target as new (resuming a copy that started on a new file).
    pub(crate) fn mark_fresh(&mut self) {
        if let TargetKind::File { .. } = self.kind {
            self.kind = TargetKind::File { fresh: true };
            self.size = u64::MAX;
        }
    }

    /// Size a fresh file target to the image (so an interrupted copy leaves a file of
    /// the image's size, which a resumed run accepts).
    pub(crate) fn presize(&self, len: u64) -> PResult<()> {
        if let TargetKind::File { fresh: true } = self.kind {
            self.file
                .set_len(len)
                .map_err(|e| io_err("resizing", &self.path, e))?;
        }
        Ok(())
    }

    pub(crate) fn check_fits(&self, end: u64) -> PResult<()> {
        if end > self.size {
            return Err(ProvisionError::TooSmall(format!(
                "{} holds {} bytes, the image needs {end}",
                self.path.display(),
                self.size
            )));
        }
        Ok(())
    }

    /// Positional write of the whole slice (aligned for O_DIRECT by the caller).
    pub(crate) fn write_at(&self, buf: &[u8], off: u64) -> PResult<()> {
        if self.kind == TargetKind::Block {
            self.check_fits(off + buf.len() as u64)?;
        }
        self.file.write_all_at(buf, off).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOSPC) {
                ProvisionError::TooSmall(format!(
                    "{}: no space left at offset {off}",
                    self.path.display()
                ))
            } else {
                io_err(
                    &format!("writing {} bytes at offset {off} of", buf.len()),
                    &self.path,
                    e,
                )
            }
        })
    }

    pub(crate) fn read_at(&self, buf: &mut [u8], off: u64) -> PResult<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.file.read_at(&mut buf[n..], off + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("reading", &self.path, e)),
            }
        }
        Ok(n)
    }

    pub(crate) fn sync(&self) -> PResult<()> {
        self.file
            .sync_data()
            .map_err(|e| io_err("syncing", &self.path, e))
    }

    /// For a file target, cut what the padded last block wrote past
    /// `max(original size, len)`; a fresh file ends exactly at `len`.
    pub(crate) fn trim_file(&self, len: u64) -> PResult<()> {
        if let TargetKind::File { fresh } = self.kind {
            let keep = if fresh { len } else { self.size.max(len) };
            let cur = self
                .file
                .metadata()
                .map_err(|e| io_err("stat", &self.path, e))?
                .len();
            if cur != keep {
                self.file
                    .set_len(keep)
                    .map_err(|e| io_err("resizing", &self.path, e))?;
            }
        }
        Ok(())
    }

    /// True when skipping a write leaves zeros: a fresh (sparse) file, or a block device
    /// after BLKZEROOUT of the range (done here).
    pub(crate) fn zero_range(&self, off: u64, len: u64) -> PResult<bool> {
        match self.kind {
            TargetKind::File { fresh: true } => Ok(true),
            TargetKind::File { fresh: false } => Ok(false),
            TargetKind::Block => {
                let r = [off, len];
                // SAFETY: valid fd and a pointer to two u64s as BLKZEROOUT expects.
                Ok(unsafe { blkzeroout(self.file.as_raw_fd(), &r) }.is_ok())
            }
        }
    }

    /// Overwrite `[0, len)` with zeros and sync (the "not bootable" state).
    pub(crate) fn zero_head(&self, len: u64) -> PResult<()> {
        if len == 0 {
            return Ok(());
        }
        let n = (len as usize).div_ceil(self.block) * self.block;
        let buf = AlignedBuf::new(n);
        let n = if self.size == u64::MAX {
            n
        } else {
            n.min(self.size as usize)
        };
        self.write_at(&buf.as_slice()[..n], 0)?;
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_matching() {
        let mi = "36 35 98:0 /mnt1 /mnt/a rw,noatime master:1 - ext3 /dev/root rw\n37 35 7:3 / /mnt/b rw - ext4 /dev/loop3 rw\n";
        assert_eq!(mounted_on(mi, &[(7, 3)]).as_deref(), Some("/mnt/b"));
        assert_eq!(mounted_on(mi, &[(7, 4)]), None);
        assert_eq!(mounted_on("garbage\n\n", &[(7, 3)]), None);
    }

    #[test]
    fn aligned_buffers_and_pool_reuse() {
        let p = Pool::new(10_000);
        let b = p.get();
        assert_eq!(b.capacity(), 12_288);
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        let ptr = b.as_slice().as_ptr();
        drop(b);
        assert_eq!(p.get().as_slice().as_ptr(), ptr);
    }

    #[test]
    fn fixed_size_file_refuses_larger_image_and_fresh_file_grows() {
        let d = tempfile::tempdir().unwrap();
        let small = d.path().join("small");
        std::fs::write(&small, vec![1u8; 8192]).unwrap();
        assert!(matches!(
            Target::open(&small, Some(8193)),
            Err(ProvisionError::TooSmall(_))
        ));
        assert!(Target::open(&small, Some(8192)).is_ok());
        let fresh = d.path().join("fresh");
        let t = Target::open(&fresh, Some(1 << 30)).unwrap();
        assert_eq!(t.kind, TargetKind::File { fresh: true });
        // A second writer is refused while the first holds the lock.
        assert!(matches!(
            Target::open(&fresh, None),
            Err(ProvisionError::TargetBusy(_))
        ));
    }
}
