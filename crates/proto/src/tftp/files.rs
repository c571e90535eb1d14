//! Request path → file bytes under the TFTP root.
//!
//! [`sanitize`] is pure: `\` becomes `/`, absolute paths and any `..` component are
//! refused, `.` and empty components are dropped. [`FileStore::open`] then resolves
//! the path (with an optional leading MAC-address component that falls back to the
//! shared file), canonicalises it and refuses anything that escapes the root through
//! a symlink. Only regular files are served: the file is opened with `O_NONBLOCK` (a
//! FIFO would otherwise block `open(2)` until a writer came) and `O_NOFOLLOW`, and
//! anything `fstat` does not call a regular file is refused. Small files are kept in
//! memory (shared by every transfer and revalidated by size/mtime/inode on each
//! request); large ones are read with `pread(2)` as they are sent, a batch of blocks at
//! a time into the engine's one buffer, so no transfer holds a copy of a file. A file's
//! netascii form is converted once per version and shared the same
//! way (in the cache, within its budget, or for as long as any transfer holds it).
//!
//! Why `pread` and not a memory map (as large files had until issue 32): a mapped file
//! truncated in place while it is served (`cp` over it, `truncate`) turns every access
//! to a page past the new end into SIGBUS, which kills the whole process (DHCP, API,
//! every transfer). The engine only handed the mapping to `sendmmsg`, where the kernel's
//! copy fails with EFAULT instead, but the netascii conversion read it in user space,
//! and nothing kept the next reader from doing so. `pread` of a truncated file returns
//! short, which ends that one transfer with an ERROR. The cost is one `pread` (a copy
//! from the page cache) per `sendmmsg` batch of up to 64 blocks, only for files above
//! `small_file_max_bytes` (4 MiB): boot loaders, the boot-storm case, are served from
//! memory as before.
//!
//! Everything here blocks (file I/O, conversion): callers run it off the async runtime.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Why a request path cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("access violation: {0}")]
    Refused(&'static str),
    #[error("file not found")]
    NotFound,
    #[error("read error: {0}")]
    Io(String),
    #[error("file too large for netascii mode, use octet")]
    TooLargeForNetascii,
}

/// The form a file is sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Form {
    /// The bytes as stored.
    Octet,
    /// Converted to netascii (RFC 764): LF → CR LF, CR → CR NUL.
    Netascii,
}

/// Normalise a request path to components relative to the root.
pub fn sanitize(name: &str) -> Result<Vec<String>, FileError> {
    if name.is_empty() {
        return Err(FileError::Refused("empty file name"));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(FileError::Refused("control character in file name"));
    }
    let name = name.replace('\\', "/");
    if name.starts_with('/') {
        return Err(FileError::Refused("absolute path"));
    }
    // Windows drive letters (`C:/...`) are absolute too.
    let b = name.as_bytes();
    if b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic() {
        return Err(FileError::Refused("absolute path"));
    }
    let mut parts = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(FileError::Refused("path traversal")),
            c => parts.push(c.to_string()),
        }
    }
    if parts.is_empty() {
        return Err(FileError::Refused("empty file name"));
    }
    Ok(parts)
}

/// Whether a path component is a MAC address (`aa:bb:cc:dd:ee:ff`, `aa-bb-...`,
/// pxelinux's `01-aa-bb-...`, or 12 bare hex digits).
pub(crate) fn is_mac(c: &str) -> bool {
    let c = c.strip_prefix("01-").filter(|r| r.len() == 17).unwrap_or(c);
    let hex: String = c.chars().filter(|ch| *ch != ':' && *ch != '-').collect();
    let seps = c.len() - hex.len();
    hex.len() == 12
        && hex.chars().all(|ch| ch.is_ascii_hexdigit())
        && (seps == 0 || (seps == 5 && c.len() == 17))
}

/// File contents shared between transfers.
#[derive(Clone, Debug)]
pub(crate) enum FileData {
    Mem(Bytes),
    /// A large file, read as it is sent; the length it had when opened.
    File(Arc<File>, u64),
    /// A converted form (netascii) shared by every transfer of one version of a file.
    Converted(Arc<Vec<u8>>),
}

impl FileData {
    /// The bytes, when they are in memory (not for [`FileData::File`]).
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            FileData::Mem(b) => Some(b),
            FileData::File(..) => None,
            FileData::Converted(v) => Some(v),
        }
    }

    /// Bytes it holds in memory (an open file costs none).
    fn mem_cost(&self) -> u64 {
        match self {
            FileData::Mem(b) => b.len() as u64,
            FileData::File(..) => 0,
            FileData::Converted(v) => v.len() as u64,
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            FileData::File(_, len) => *len as usize,
            d => d.bytes().map_or(0, <[u8]>::len),
        }
    }

    /// Fill `buf` with the bytes at `pos`: copied from memory, or read from the file.
    /// A file that no longer has them (truncated while served) is an `UnexpectedEof`.
    pub(crate) fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        match self {
            FileData::File(f, _) => f.read_exact_at(buf, pos),
            d => {
                let src = d.bytes().unwrap_or_default();
                let got = usize::try_from(pos)
                    .ok()
                    .and_then(|p| src.get(p..p.checked_add(buf.len())?))
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(got);
                Ok(())
            }
        }
    }

    /// All of it in memory (a file is read whole: for the netascii conversion, which
    /// is bounded by `netascii_max_bytes`).
    fn whole(&self) -> std::io::Result<std::borrow::Cow<'_, [u8]>> {
        if let Some(b) = self.bytes() {
            return Ok(std::borrow::Cow::Borrowed(b));
        }
        let mut v = vec![0u8; self.len()];
        self.read_at(&mut v, 0)?;
        Ok(std::borrow::Cow::Owned(v))
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
struct Stamp {
    len: u64,
    mtime_ns: i128,
    ino: u64,
    dev: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ino: m.ino(),
            dev: m.dev(),
        }
    }
}

/// Resolves and loads files under one root.
#[derive(Debug)]
pub(crate) struct FileStore {
    root: PathBuf,
    small_max: u64,
    cache_max: u64,
    netascii_max: u64,
    cache: Mutex<Cache>,
}

/// A file in one form.
type Key = (PathBuf, Form);
/// A load in progress, see [`Cache::loading`].
type Gate = Arc<Mutex<Option<(Stamp, FileData)>>>;

#[derive(Debug, Default)]
struct Cache {
    /// Memory held by `entries`, at most `cache_max`.
    bytes: u64,
    entries: HashMap<Key, (Stamp, FileData)>,
    /// Files being loaded, one gate each: the first request for a file loads it into
    /// the gate while the others for the same file wait and then take that copy (also
    /// when it did not fit the cache). Without this, a storm's first burst of RRQs
    /// loaded one private copy per request (76 MiB of copies of a 1 MiB boot file in
    /// one 10,000-machine run) and each transfer kept its copy to the end.
    loading: HashMap<Key, Gate>,
    /// Converted forms that did not fit the cache, while transfers hold them: a request
    /// for the same version shares the copy instead of converting its own (2,048
    /// netascii requests for one file used to hold 2,048 converted copies).
    in_use: HashMap<PathBuf, (Stamp, Weak<Vec<u8>>)>,
}

impl Cache {
    fn lookup(&self, key: &Key, stamp: &Stamp) -> Option<FileData> {
        if let Some((s, d)) = self.entries.get(key) {
            if s == stamp {
                return Some(d.clone());
            }
        }
        if key.1 == Form::Netascii {
            let (s, w) = self.in_use.get(&key.0)?;
            if s == stamp {
                return w.upgrade().map(FileData::Converted);
            }
        }
        None
    }
}

impl FileStore {
    /// `small_max`: files up to this size are held in memory; `cache_max`: total
    /// bytes of in-memory files kept (mappings of large files are cached too but
    /// cost only address space).
    pub(crate) fn new(root: &Path, small_max: u64, cache_max: u64) -> anyhow::Result<FileStore> {
        use anyhow::Context as _;
        let root = root
            .canonicalize()
            .with_context(|| format!("opening tftp root {}", root.display()))?;
        anyhow::ensure!(
            root.is_dir(),
            "tftp root {} is not a directory",
            root.display()
        );
        Ok(FileStore {
            root,
            small_max,
            cache_max,
            netascii_max: 16 << 20,
            cache: Mutex::new(Cache::default()),
        })
    }

    /// Largest file served in netascii form (16 MiB unless set).
    pub(crate) fn with_netascii_max(mut self, max: u64) -> FileStore {
        self.netascii_max = max;
        self
    }

    /// Resolve a request name to a canonical file path inside the root.
    pub(crate) fn resolve(&self, name: &str) -> Result<PathBuf, FileError> {
        let parts = sanitize(name)?;
        let full: PathBuf = parts.iter().collect();
        match self.check(&full) {
            Err(FileError::NotFound) if parts.len() > 1 && is_mac(&parts[0]) => {
                let shared: PathBuf = parts[1..].iter().collect();
                self.check(&shared)
            }
            r => r,
        }
    }

    fn check(&self, rel: &Path) -> Result<PathBuf, FileError> {
        let p = match self.root.join(rel).canonicalize() {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FileError::NotFound),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(FileError::NotFound),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(FileError::Refused("permission denied"))
            }
            Err(e) => return Err(FileError::Io(e.to_string())),
        };
        if !p.starts_with(&self.root) {
            return Err(FileError::Refused("outside the tftp root"));
        }
        Ok(p)
    }

    /// Resolve and load a file as stored.
    #[cfg(test)]
    pub fn open(&self, name: &str) -> Result<FileData, FileError> {
        self.open_as(name, Form::Octet)
    }

    /// Resolve and load a file in `form`. Blocks (file I/O, conversion).
    pub(crate) fn open_as(&self, name: &str, form: Form) -> Result<FileData, FileError> {
        let path = self.resolve(name)?;
        let (file, meta) = open_regular(&path)?;
        if form == Form::Netascii && meta.len() > self.netascii_max {
            return Err(FileError::TooLargeForNetascii);
        }
        self.get(&file, &meta, &path, &Stamp::of(&meta), form)
    }

    /// `file` in `form`: from the cache, or loaded (converted) once however many
    /// requests for it arrive together.
    fn get(
        &self,
        file: &File,
        meta: &std::fs::Metadata,
        path: &Path,
        stamp: &Stamp,
        form: Form,
    ) -> Result<FileData, FileError> {
        let key = (path.to_path_buf(), form);
        let gate = {
            let mut c = self.lock();
            if let Some(d) = c.lookup(&key, stamp) {
                return Ok(d);
            }
            c.loading.entry(key.clone()).or_default().clone()
        };
        let loaded = {
            let mut slot = gate.lock().unwrap_or_else(|p| p.into_inner());
            match &*slot {
                // loaded by whoever held the gate before
                Some((s, d)) if s == stamp => Ok(d.clone()),
                _ => {
                    let r = match form {
                        Form::Octet => load(file, meta, self.small_max),
                        // the stored form comes from the cache (or is loaded) first; its
                        // gate is only ever taken inside this one, never the other way
                        Form::Netascii => {
                            self.get(file, meta, path, stamp, Form::Octet)
                                .and_then(|src| {
                                    let whole =
                                        src.whole().map_err(|e| FileError::Io(e.to_string()))?;
                                    Ok(FileData::Converted(Arc::new(to_netascii(&whole))))
                                })
                        }
                    };
                    if let Ok(d) = &r {
                        self.keep(key.clone(), stamp.clone(), d.clone());
                        *slot = Some((stamp.clone(), d.clone()));
                    }
                    r
                }
            }
        };
        let mut c = self.lock();
        // the last one through the gate removes it (a request arriving after that
        // finds the file cached, or loads it again if it did not fit the cache)
        if Arc::strong_count(&gate) == 2 {
            c.loading.remove(&key);
        }
        loaded
    }

    /// Cache `data` if it fits the budget; a converted form that does not is still
    /// shared while transfers hold it.
    fn keep(&self, key: Key, stamp: Stamp, data: FileData) {
        let mut c = self.lock();
        if let Some((_, old)) = c.entries.remove(&key) {
            c.bytes -= old.mem_cost();
        }
        let cost = data.mem_cost();
        if c.bytes + cost <= self.cache_max {
            c.bytes += cost;
            c.entries.insert(key, (stamp, data));
        } else if let FileData::Converted(v) = &data {
            c.in_use.retain(|_, (_, w)| w.strong_count() > 0);
            c.in_use.insert(key.0, (stamp, Arc::downgrade(v)));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Open `path` for reading if it is a regular file. Checked before opening (so a device
/// is never opened) and again on the open file (it may have been replaced in between).
fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), FileError> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound,
        std::io::ErrorKind::PermissionDenied => FileError::Refused("permission denied"),
        _ if e.raw_os_error() == Some(libc::ELOOP) => FileError::Refused("symbolic link"),
        _ => FileError::Io(e.to_string()),
    };
    regular(path, &std::fs::symlink_metadata(path).map_err(io)?)?;
    // O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise (regular
    // files ignore it); O_NOFOLLOW: the path is canonical, so a symlink now is a swap.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    regular(path, &meta)?;
    Ok((file, meta))
}

/// Refuse what is not a regular file: a directory is "not found", anything else (FIFO,
/// socket, device) is refused and logged, as it was put in the root by mistake.
fn regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), FileError> {
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    if t.is_dir() {
        return Err(FileError::NotFound);
    }
    let kind = if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    };
    tracing::warn!(path = %path.display(), kind, "tftp: refusing a request for a file that is not a regular file");
    Err(FileError::Refused("not a regular file"))
}

/// Read (small) or keep open (large) a file.
fn load(file: &File, meta: &std::fs::Metadata, small_max: u64) -> Result<FileData, FileError> {
    Ok(if meta.len() == 0 {
        FileData::Mem(Bytes::new())
    } else if meta.len() <= small_max {
        let mut v = Vec::with_capacity(meta.len() as usize);
        use std::io::Read as _;
        file.take(meta.len())
            .read_to_end(&mut v)
            .map_err(|e| FileError::Io(e.to_string()))?;
        FileData::Mem(Bytes::from(v))
    } else {
        // Read as it is sent (see the module doc: no mapping, so a truncation cannot
        // fault). A second descriptor, as the caller's is closed after the request.
        let f = file.try_clone().map_err(|e| FileError::Io(e.to_string()))?;
        FileData::File(Arc::new(f), meta.len())
    })
}

/// Convert bytes to netascii (RFC 764): LF → CR LF, CR → CR NUL.
pub(crate) fn to_netascii(data: &[u8]) -> Vec<u8> {
    let extra = data.iter().filter(|&&b| b == b'\n' || b == b'\r').count();
    let mut out = Vec::with_capacity(data.len() + extra);
    for &b in data {
        match b {
            b'\n' => out.extend_from_slice(b"\r\n"),
            b'\r' => out.extend_from_slice(b"\r\0"),
            b => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_rules() {
        assert_eq!(sanitize("ipxe.efi").unwrap(), vec!["ipxe.efi"]);
        assert_eq!(
            sanitize("efi\\boot\\x.efi").unwrap(),
            vec!["efi", "boot", "x.efi"]
        );
        assert_eq!(sanitize("a/./b//c").unwrap(), vec!["a", "b", "c"]);
        for bad in [
            "",
            "/etc/passwd",
            "\\etc\\passwd",
            "../x",
            "a/../../x",
            "a\\..\\..\\x",
            "..",
            "C:\\x",
            "c:/x",
            "a/..",
            ".",
            "a\nb",
        ] {
            assert!(
                matches!(sanitize(bad), Err(FileError::Refused(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn mac_forms() {
        for m in [
            "52:54:00:12:34:56",
            "52-54-00-12-34-56",
            "01-52-54-00-12-34-56",
            "525400123456",
            "AA:bb:CC:dd:EE:ff",
        ] {
            assert!(is_mac(m), "{m}");
        }
        for m in [
            "ipxe",
            "52:54:00:12:34",
            "52:54:00:12:34:5g",
            "5254:0012:3456",
            "01-5254001234",
        ] {
            assert!(!is_mac(m), "{m}");
        }
    }

    #[test]
    fn a_burst_of_opens_of_an_uncached_file_shares_one_copy() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("boot.efi"), vec![3u8; 1 << 20]).unwrap();
        let s = Arc::new(FileStore::new(d.path(), 4 << 20, 32 << 20).unwrap());
        let start = Arc::new(std::sync::Barrier::new(16));
        let opened: Vec<FileData> = (0..16)
            .map(|_| {
                let (s, start) = (s.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    s.open("boot.efi").unwrap()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let first = opened[0].bytes().unwrap().as_ptr();
        for f in &opened {
            assert!(matches!(f, FileData::Mem(_)));
            assert_eq!(
                f.bytes().unwrap().as_ptr(),
                first,
                "a request loaded its own copy"
            );
        }
        assert!(s.lock().loading.is_empty(), "a load gate was left behind");
    }

    #[test]
    fn store_resolves_caches_and_confines() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("small"), b"hello").unwrap();
        std::fs::write(root.join("sub/big"), vec![7u8; 5000]).unwrap();
        std::fs::write(d.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("link")).unwrap();
        let s = FileStore::new(&root, 1000, 1 << 20).unwrap();
        assert!(matches!(s.open("small").unwrap(), FileData::Mem(ref b) if &b[..] == b"hello"));
        assert!(matches!(
            s.open("sub\\big").unwrap(),
            FileData::File(_, 5000)
        ));
        assert_eq!(
            s.open("52:54:00:12:34:56/small").unwrap().bytes().unwrap(),
            b"hello"
        );
        assert_eq!(s.open("01-52-54-00-12-34-56/sub/big").unwrap().len(), 5000);
        assert_eq!(s.open("nothere").unwrap_err(), FileError::NotFound);
        assert_eq!(s.open("small/x").unwrap_err(), FileError::NotFound);
        assert_eq!(s.open("sub").unwrap_err(), FileError::NotFound);
        assert!(matches!(s.open("link"), Err(FileError::Refused(_))));
        assert!(matches!(s.open("../secret"), Err(FileError::Refused(_))));
        // revalidated after a change
        std::fs::write(root.join("small"), b"changed!").unwrap();
        assert_eq!(s.open("small").unwrap().bytes().unwrap(), b"changed!");
        std::fs::write(root.join("empty"), b"").unwrap();
        assert_eq!(s.open("empty").unwrap().len(), 0);
    }

    #[test]
    fn netascii_is_converted_once_per_version_and_shared() {
        let d = tempfile::tempdir().unwrap();
        let text = b"line\r\n".repeat(1000);
        std::fs::write(d.path().join("t.txt"), &text).unwrap();
        // no cache budget: the converted copy is still shared while a transfer holds it
        let s = FileStore::new(d.path(), 1 << 20, 0).unwrap();
        let a = s.open_as("t.txt", Form::Netascii).unwrap();
        let b = s.open_as("t.txt", Form::Netascii).unwrap();
        assert_eq!(a.bytes().unwrap(), &to_netascii(&text)[..]);
        assert_eq!(
            a.bytes().unwrap().as_ptr(),
            b.bytes().unwrap().as_ptr(),
            "a netascii request converted its own copy"
        );
        assert_eq!(s.open("t.txt").unwrap().bytes().unwrap(), &text[..]);
        drop((a, b));
        assert!(s.lock().in_use.values().all(|(_, w)| w.strong_count() == 0));
        // with a budget it is cached, and counted in it with the stored form
        let s = FileStore::new(d.path(), 1 << 20, 1 << 20).unwrap();
        let p = s
            .open_as("t.txt", Form::Netascii)
            .unwrap()
            .bytes()
            .unwrap()
            .as_ptr();
        assert_eq!(
            s.open_as("t.txt", Form::Netascii)
                .unwrap()
                .bytes()
                .unwrap()
                .as_ptr(),
            p
        );
        assert_eq!(
            s.lock().bytes,
            (text.len() + to_netascii(&text).len()) as u64
        );
        // a new version is converted again
        std::fs::write(d.path().join("t.txt"), b"new\n").unwrap();
        assert_eq!(
            s.open_as("t.txt", Form::Netascii).unwrap().bytes().unwrap(),
            b"new\r\n"
        );
        let s = FileStore::new(d.path(), 1 << 20, 1 << 20)
            .unwrap()
            .with_netascii_max(3);
        assert_eq!(
            s.open_as("t.txt", Form::Netascii).unwrap_err(),
            FileError::TooLargeForNetascii
        );
        assert_eq!(s.open("t.txt").unwrap().len(), 4);
    }

    #[test]
    fn only_regular_files_are_served() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(d.path().join("sock")).unwrap();
        let s = FileStore::new(d.path(), 1 << 20, 1 << 20).unwrap();
        // (an open(2) of the FIFO without O_NONBLOCK would hang here)
        for name in ["pipe", "sock"] {
            assert_eq!(
                s.open(name).unwrap_err(),
                FileError::Refused("not a regular file"),
                "{name}"
            );
        }
        assert!(matches!(
            open_regular(&fifo),
            Err(FileError::Refused("not a regular file"))
        ));
    }

    #[test]
    fn netascii_conversion() {
        assert_eq!(to_netascii(b"a\nb\rc\r\n"), b"a\r\nb\r\0c\r\0\r\n".to_vec());
    }
}
