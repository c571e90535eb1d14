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
