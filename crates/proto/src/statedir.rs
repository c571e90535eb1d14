//! The state directory's permissions. It holds Secret data (the store with Ignition
//! secrets, the API token, the boot-token key), so `serve` makes sure at start that it is
//! private: the directory is created 0700 (or made 0700, with a warning saying what was
//! changed), every regular file in it or below it is made at most 0600 and every
//! subdirectory (`tls/`, `ganesha/`, `qemu/`) at most 0700 (each change logged), and a
//! directory that belongs to another user is refused (whoever owns it could swap the
//! files under us, and chmod would fail anyway unless we are root). A state dir restored
//! from a backup with 0755/0644 modes so gets `tls/ca.key` back to 0600 at start.
//!
//! Files bootplane creates there are created 0600 by their writers (`OpenOptions::mode`,
//! so the umask can only narrow them). The NFS images directory is not rewritten even
//! when it is below the state dir: an exported tree must keep the modes the NFS server
//! serves.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

use anyhow::{bail, Context as _, Result};

/// Mode of the state directory.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file directly in it.
pub(crate) const FILE_MODE: u32 = 0o600;

/// Write `bytes` to `path` (a secret or a file holding one) through a 0600 temporary file
/// beside it (named with this process's id, so two writers never share it), synced, then
/// renamed over `path`: a reader sees the old file or the whole new one.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Read at most `max` bytes of the file `path`; a larger file is an error naming it. An
/// open failure keeps its `std::io::Error` (callers test for `NotFound`).
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut b = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut b)
        .with_context(|| format!("reading {}", path.display()))?;
    if b.len() as u64 > max {
        bail!("{} is larger than {max} bytes", path.display());
    }
    Ok(b)
}

/// One permission change made by [`prepare`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    pub path: std::path::PathBuf,
    pub old_mode: u32,
    pub new_mode: u32,
}

/// Subdirectories deeper than this below the state dir are left as they are.
const MAX_DEPTH: usize = 16;

/// Create `dir` 0700 when absent; otherwise check it is ours and make it and everything
/// below it private: every directory at most 0700, every regular file at most 0600
/// (`tls/ca.key` included: whoever reads it can mint an admin certificate). The trees in
/// `served` (an NFS images directory another daemon exports) keep their modes; symlinks
/// are never followed. Every change is logged as a warning and returned.
pub fn prepare(dir: &Path, served: &[&Path]) -> Result<Vec<Fixed>> {
    if std::fs::symlink_metadata(dir).is_err() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
            Ok(()) => {}
            // Created meanwhile by someone else: checked like any existing directory.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("creating state dir {}", dir.display()))
            }
        }
    }
    // The directory itself may be a symlink an operator set up: follow it.
    let md =
        std::fs::metadata(dir).with_context(|| format!("reading state dir {}", dir.display()))?;
    if !md.is_dir() {
        bail!("state dir {} is not a directory", dir.display());
    }
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me {
        bail!(
            "state dir {} belongs to uid {}, not to uid {me} that runs bootplane; refusing to keep secrets in it (chown it, or choose another --state-dir)",
            dir.display(),
            md.uid()
        );
    }
    let mut fixed = Vec::new();
    let mode = md.permissions().mode() & 0o7777;
    if mode != DIR_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
            .with_context(|| format!("making state dir {} private", dir.display()))?;
        fixed.push(Fixed {
            path: dir.to_path_buf(),
            old_mode: mode,
            new_mode: DIR_MODE,
        });
    }
    // Served trees are known by device and inode: the paths may be spelled differently.
    let keep: Vec<(u64, u64)> = served
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    let mut todo = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = todo.pop() {
        let entries = std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("listing {}", d.display()))?;
            let path = e.path();
            // lstat: a symlink is never followed (its target is not ours to change).
            let Ok(md) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if md.is_dir() {
                if keep.contains(&(md.dev(), md.ino())) || depth >= MAX_DEPTH {
                    continue;
                }
                restrict(&path, &md, DIR_MODE, &mut fixed)?;
                todo.push((path, depth + 1));
            } else if md.is_file() {
                restrict(&path, &md, FILE_MODE, &mut fixed)?;
            }
        }
    }
    for f in &fixed {
        tracing::warn!(
            path = %f.path.display(),
            old_mode = %format!("{:#o}", f.old_mode),
            new_mode = %format!("{:#o}", f.new_mode),
            "state dir entry was open to other users; restricted it (it may hold secrets)"
        );
    }
    Ok(fixed)
}

/// Clear the bits of `path` outside `max`, through a descriptor opened without following
/// links (the entry cannot be swapped for a symlink between the check and the change).
fn restrict(path: &Path, md: &std::fs::Metadata, max: u32, fixed: &mut Vec<Fixed>) -> Result<()> {
    let mode = md.permissions().mode() & 0o7777;
    if mode & !max == 0 {
        return Ok(());
    }
    let dir = if md.is_dir() { libc::O_DIRECTORY } else { 0 };
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | dir)
        .open(path)
        .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(mode & max)))
        .with_context(|| format!("making {} private", path.display()))?;
    fixed.push(Fixed {
        path: path.to_path_buf(),
        old_mode: mode,
        new_mode: mode & max,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn creates_private_and_fixes_open_entries() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/state");
        assert!(prepare(&dir, &[]).unwrap().is_empty());
        assert_eq!(mode(&dir), 0o700);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = dir.join("store.redb");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let ro = dir.join("ro");
        std::fs::write(&ro, b"x").unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o400)).unwrap();
        // A link to a file outside: neither followed nor changed.
        let outside = t.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        // Below it too: tls/ with its keys, restored 0755/0644.
        let tls = dir.join("tls");
        std::fs::create_dir(&tls).unwrap();
        std::fs::set_permissions(&tls, std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = tls.join("ca.key");
        std::fs::write(&key, b"k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A served tree keeps its modes.
        let served = dir.join("nfs-images");
        std::fs::create_dir(&served).unwrap();
        std::fs::set_permissions(&served, std::fs::Permissions::from_mode(0o755)).unwrap();
        let image = served.join("os.img");
        std::fs::write(&image, b"i").unwrap();
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();

        let fixed = prepare(&dir, &[&served]).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!((mode(&tls), mode(&key)), (0o700, 0o600));
        assert_eq!((mode(&served), mode(&image)), (0o755, 0o644));
        assert_eq!(mode(&f), 0o600);
        assert_eq!(mode(&ro), 0o400);
        assert_eq!(mode(&outside), 0o644);
        let mut got: Vec<(String, u32)> = fixed
            .iter()
            .map(|x| {
                (
                    x.path.file_name().unwrap().to_string_lossy().into(),
                    x.old_mode,
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("ca.key".to_string(), 0o644),
                ("state".to_string(), 0o755),
                ("store.redb".to_string(), 0o644),
                ("sub".to_string(), 0o755),
                ("tls".to_string(), 0o755),
            ]
        );
        assert!(
            prepare(&dir, &[&served]).unwrap().is_empty(),
            "nothing left to fix"
        );
    }

    #[test]
    fn a_file_is_not_a_state_dir() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let e = prepare(&f, &[]).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
