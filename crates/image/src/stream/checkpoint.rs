//! The resume checkpoint of a copy: where it lives, and reading and writing it without
//! ever following a symlink (see "Resume" in the stream's module doc).

use super::*;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(super) struct Checkpoint {
    pub(super) version: u32,
    pub(super) image_sha256: String,
    pub(super) chunk_size: u64,
    pub(super) chunks_done: u64,
    pub(super) hash_state: String,
    /// The target was a new file in the first run (so it may grow and is cut to size).
    pub(super) target_fresh: bool,
}

/// Where the checkpoint of a copy to `target` lives unless `--checkpoint` says: next to
/// a file target, in `/var/tmp` for a block device. Decided before the target is opened
/// (a target that does not exist yet becomes a file).
pub(super) fn default_checkpoint(target: &Path) -> PathBuf {
    use std::os::unix::fs::FileTypeExt as _;
    let is_block = std::fs::metadata(target).is_ok_and(|m| m.file_type().is_block_device());
    match is_block {
        false => {
            let mut s = target.as_os_str().to_owned();
            s.push(".bootplane-checkpoint");
            s.into()
        }
        true => {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "disk".into());
            PathBuf::from(format!("/var/tmp/bootplane-{name}.checkpoint"))
        }
    }
}

/// A checkpoint is a few hundred bytes; anything larger is not one of ours.
const CHECKPOINT_MAX: u64 = 64 << 10;

/// The temporary file a checkpoint is written to before it is renamed into place:
/// `CKPT.tmp`. Appended, not `with_extension`: that turned `disk.img.bootplane-checkpoint`
/// into `disk.img.tmp`, a name that may be the operator's own file, which a stale
/// temporary file of ours is removed as (and was truncated as before that).
pub(super) fn checkpoint_tmp(ckpt: &Path) -> PathBuf {
    let mut s = ckpt.as_os_str().to_owned();
    s.push(".tmp");
    s.into()
}

/// Refuse a checkpoint path (or its temporary path) that is a symlink or not a regular
/// file; a leftover temporary file of ours (a run killed while writing it) is removed.
pub(super) fn check_checkpoint_paths(ckpt: &Path) -> PResult<()> {
    use std::os::unix::fs::MetadataExt as _;
    let tmp = checkpoint_tmp(ckpt);
    for (p, what) in [
        (ckpt, "checkpoint path"),
        (tmp.as_path(), "checkpoint temporary path"),
    ] {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(ProvisionError::Checkpoint(format!(
                    "{what} {} is a symlink; refusing to follow it (remove it, or pass --checkpoint in a directory only root can write)",
                    p.display()
                )))
            }
            Ok(m) if !m.is_file() => {
                return Err(ProvisionError::Checkpoint(format!(
                    "{what} {} exists and is not a regular file",
                    p.display()
                )))
            }
            Ok(m) if m.uid() != unsafe { libc::geteuid() } => {
                return Err(ProvisionError::Checkpoint(format!(
                    "{what} {} belongs to uid {}, not to this user; refusing to use it",
                    p.display(),
                    m.uid()
                )))
            }
            Ok(_) if p == tmp => std::fs::remove_file(p).map_err(|e| {
                ProvisionError::Checkpoint(format!(
                    "removing the stale {what} {}: {e}",
                    p.display()
                ))
            })?,
            _ => {}
        }
    }
    Ok(())
}

/// Read a checkpoint without following a symlink; `None` when there is none (or it is
/// not one: too large, unreadable).
pub(super) fn read_checkpoint(ckpt: &Path) -> Option<Checkpoint> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(ckpt)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut b = Vec::new();
    f.take(CHECKPOINT_MAX).read_to_end(&mut b).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Write `data` as the checkpoint: a new temporary file (`O_EXCL | O_NOFOLLOW`, 0600:
/// nothing that someone else put at that path is opened or followed), synced, then
/// renamed over `ckpt` (rename replaces a link at `ckpt`, never its target).
pub(super) fn write_checkpoint(ckpt: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = checkpoint_tmp(ckpt);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("creating {} (O_EXCL, no symlinks): {e}", tmp.display()),
            )
        })?;
    let written = f.write_all(data).and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, ckpt)
}

/// Where a copy's checkpoint is kept: a file (`--checkpoint`, or [`default_checkpoint`]),
/// or the target itself ([`Options::checkpoint_on_target`]).
pub(super) enum Store {
    File(PathBuf),
    Target,
}

/// Offset of the on-target checkpoint: a block inside the held first MiB, which is zero
/// (but for this block) until the verified image's own first MiB replaces it, so it
/// survives a reset and never outlives a finished copy. No partition table, boot sector
/// or file system signature lives at this offset.
pub const TARGET_CKPT_OFF: u64 = HELD - (64 << 10);
/// Size of the on-target checkpoint block (one 4 KiB block: aligned for `O_DIRECT`).
const TARGET_CKPT_LEN: usize = 4096;
/// The block's first bytes; then the JSON's length (u32, little-endian) and the JSON.
pub const TARGET_CKPT_MAGIC: &[u8; 16] = b"BOOTPLANE-CKPT01";

/// The on-target checkpoint block holding `data` (a serialized [`Checkpoint`]).
pub(super) fn target_block(data: &[u8]) -> PResult<AlignedBuf> {
    if data.len() > TARGET_CKPT_LEN - 20 {
        return Err(ProvisionError::Internal(format!(
            "a checkpoint of {} bytes does not fit its block",
            data.len()
        )));
    }
    let mut b = AlignedBuf::new(TARGET_CKPT_LEN);
    let s = b.as_mut_slice();
    s[..16].copy_from_slice(TARGET_CKPT_MAGIC);
    s[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
    s[20..20 + data.len()].copy_from_slice(data);
    Ok(b)
}

/// Write the on-target checkpoint block and sync it.
pub(super) fn write_target_checkpoint(target: &Target, data: &[u8]) -> PResult<()> {
    let b = target_block(data)?;
    target.write_at(&b.as_slice()[..TARGET_CKPT_LEN], TARGET_CKPT_OFF)?;
    target.sync()
}

/// The checkpoint in the target's checkpoint block; `None` when there is none.
pub(super) fn read_target_checkpoint(target: &Target) -> Option<Checkpoint> {
    let mut b = AlignedBuf::new(TARGET_CKPT_LEN);
    let got = target
        .read_at(&mut b.as_mut_slice()[..TARGET_CKPT_LEN], TARGET_CKPT_OFF)
        .ok()?;
    let s = &b.as_slice()[..got];
    if got < 20 || &s[..16] != TARGET_CKPT_MAGIC {
        return None;
    }
    let len = u32::from_le_bytes([s[16], s[17], s[18], s[19]]) as usize;
    serde_json::from_slice(s.get(20..20 + len)?).ok()
}

/// Where a copy's checkpoints go and what happens to them when it fails or finishes.
pub(super) struct Keeper {
    store: Store,
    /// Checkpoints are written (on the target: only when the head is the whole held MiB,
    /// so the block is inside what the image's first MiB replaces).
    on_target: bool,
    /// The last checkpoint written to the target (rewritten after the head is zeroed on a
    /// failure that keeps it).
    last: Mutex<Option<Vec<u8>>>,
    lock: Mutex<()>,
}

impl Keeper {
    /// The store for `opts`; a file checkpoint's paths are checked here, before the
    /// target is touched.
    pub(super) fn new(opts: &Options) -> PResult<Keeper> {
        let store = match opts.checkpoint_on_target {
            true => Store::Target,
            false => Store::File(
                opts.checkpoint
                    .clone()
                    .unwrap_or_else(|| default_checkpoint(&opts.target)),
            ),
        };
        if let Store::File(p) = &store {
            check_checkpoint_paths(p)?;
        }
        Ok(Keeper {
            store,
            on_target: false,
            last: Mutex::new(None),
            lock: Mutex::new(()),
        })
    }

    /// The checkpoint there is, if any.
    pub(super) fn read(&self, target: &Target) -> Option<Checkpoint> {
        match &self.store {
            Store::File(p) => read_checkpoint(p),
            Store::Target => read_target_checkpoint(target),
        }
    }

    /// Once the held head's size is known: an image smaller than the held MiB gets no
    /// on-target checkpoint.
    pub(super) fn arm(&mut self, head: u64) {
        self.on_target = matches!(self.store, Store::Target) && head == HELD;
    }

    /// Write `c` (a file renamed into place, or the target's block, synced).
    pub(super) fn write(&self, target: &Target, c: &Checkpoint) -> PResult<()> {
        let _g = self.lock.lock();
        let data = serde_json::to_vec(c).map_err(|e| ProvisionError::Internal(e.to_string()))?;
        match &self.store {
            Store::File(p) => write_checkpoint(p, &data)
                .map_err(|e| ProvisionError::Checkpoint(format!("writing {}: {e}", p.display()))),
            Store::Target if self.on_target => {
                write_target_checkpoint(target, &data)?;
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(data);
                Ok(())
            }
            Store::Target => Ok(()),
        }
    }

    /// Whether checkpoints go to the target's block.
    pub(super) fn on_target(&self) -> bool {
        self.on_target
    }

    /// After a failure (the head already zeroed): a checkpoint that cannot be trusted
    /// (integrity, manifest, checkpoint mismatch) is dropped; any other failure keeps it
    /// (the target's block is written again).
    pub(super) fn failed(&self, target: &Target, e: &ProvisionError) {
        let drop_it = matches!(
            e,
            ProvisionError::Integrity(_)
                | ProvisionError::Manifest(_)
                | ProvisionError::Checkpoint(_)
        );
        match &self.store {
            Store::File(p) if drop_it => {
                let _ = std::fs::remove_file(p);
            }
            Store::Target if !drop_it => {
                let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some(d) = last {
                    let _ = write_target_checkpoint(target, &d);
                }
            }
            _ => {}
        }
    }

    /// After a verified copy: a file checkpoint is removed (the image's own first MiB
    /// already replaced an on-target one).
    pub(super) fn done(&self) {
        if let Store::File(p) = &self.store {
            let _ = std::fs::remove_file(p);
        }
    }
}
