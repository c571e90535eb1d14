//! The image catalog (`images/catalog.toml`): maps an image reference such as
//! `os-image:latest` (a claim's `image`) to its kernel, initrd, optional rootfs, default
//! kernel arguments, architecture and the SHA-256 of each file. Paths are relative to the
//! catalog's directory, which the boot listener serves at `/assets/images/`.
//!
//! ```toml
//! [[image]]
//! ref = "os-image:latest"
//! arch = "amd64"
//! cmdline = "rd.neednet=1"
//! kernel = { path = "os-image/vmlinuz", sha256 = "<64 hex>" }
//! initrd = { path = "os-image/initrd.img", sha256 = "<64 hex>" }
//! # rootfs = { path = "os-image/root.squashfs", sha256 = "<64 hex>" }
//! ```
//!
//! A `[[disk]]` entry is a disk image a claim installs onto the machine's own disk through
//! the agent (docs/install.md): the packed image (`bootplane image pack`), its manifest
//! beside it (`<path>.manifest.json`), and the raw image's SHA-256, pinned here: the
//! manifest must say the same, and the agent verifies the streamed bytes against it.
//!
//! ```toml
//! [[disk]]
//! ref = "debian-12:disk"
//! path = "debian-12/disk.img.zst"
//! sha256 = "<64 hex: the raw image>"
//! root_device_hints = { size = ">= 8" }   # optional, Ironic's rootDeviceHints
//! ```
//!
//! Resolution is pure ([`Catalog::resolve`] over [`FileFacts`], [`Catalog::resolve_disk`]
//! over a manifest reader); the I/O steps, hashing files and reading manifests, are
//! [`FileHasher`]'s, which caches each file's digest by (size, mtime) so a reconcile loop
//! does not re-read gigabytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// File name of the catalog inside the images directory.
pub const CATALOG_FILE: &str = "catalog.toml";

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileRef {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ImageEntry {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default = "default_arch")]
    pub arch: String,
    #[serde(default)]
    pub cmdline: String,
    pub kernel: FileRef,
    pub initrd: FileRef,
    #[serde(default)]
    pub rootfs: Option<FileRef>,
}

fn default_arch() -> String {
    "amd64".into()
}

/// A disk image a claim installs onto the machine's disk (`[[disk]]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiskEntry {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default = "default_arch")]
    pub arch: String,
    /// The packed image, catalog-relative; its manifest is `<path>.manifest.json`.
    pub path: String,
    /// The raw image's SHA-256.
    pub sha256: String,
    /// Ironic's `rootDeviceHints` (the agent's matcher checks them); a Server's
    /// annotation `bootplane.dev/root-device-hints` replaces them.
    #[serde(default)]
    pub root_device_hints: Option<toml::Table>,
}

/// Most bytes of root-device hints (as JSON) passed to the agent.
pub const MAX_HINTS_BYTES: usize = 1024;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    #[serde(default, rename = "image")]
    pub images: Vec<ImageEntry>,
    #[serde(default, rename = "disk")]
    pub disks: Vec<DiskEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("parsing image catalog: {0}")]
    Parse(String),
    #[error("image {image}: {role} path {path:?} must be relative, without empty segments or segments starting with `.`, `\\`, `%` or control characters")]
    BadPath {
        image: String,
        role: &'static str,
        path: String,
    },
    #[error("image {image}: {role} sha256 must be 64 hex digits")]
    BadDigest { image: String, role: &'static str },
    #[error("image {0} is listed twice")]
    Duplicate(String),
    #[error("disk image {image}: root_device_hints: {why}")]
    BadHints { image: String, why: String },
}

/// Why an image cannot be booted; the message is what the boot configuration's `Error`
/// condition shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("unknown image {0:?} (not in the image catalog)")]
    UnknownImage(String),
    #[error("image {image}: {role} file {path} is missing")]
    MissingFile {
        image: String,
        role: &'static str,
        path: String,
    },
    #[error("disk image {image}: manifest {path}: {why}")]
    BadManifest {
        image: String,
        path: String,
        why: String,
    },
    #[error("image {image}: {role} file {path} has sha256 {actual}, catalog says {expected}")]
    ChecksumMismatch {
        image: String,
        role: &'static str,
        path: String,
        expected: String,
        actual: String,
    },
}

impl ImageError {
    /// A short machine-readable reason for status conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            ImageError::UnknownImage(_) => "UnknownImage",
            ImageError::MissingFile { .. } => "MissingFile",
            ImageError::ChecksumMismatch { .. } => "ChecksumMismatch",
            ImageError::BadManifest { .. } => "BadManifest",
        }
    }
}

/// A bootable image: catalog-relative paths, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    pub reference: String,
    pub arch: String,
    pub cmdline: String,
    pub kernel: String,
    pub initrd: String,
    pub rootfs: Option<String>,
}

impl ResolvedImage {
    /// URLs under `<base_url>/assets/images/`.
    pub fn boot_files(&self, base_url: &str) -> super::BootFiles {
        let url = |p: &str| {
            format!(
                "{}/assets/images/{}",
                base_url.trim_end_matches('/'),
                encode_path(p)
            )
        };
        super::BootFiles {
            image: self.reference.clone(),
            arch: self.arch.clone(),
            kernel_url: url(&self.kernel),
            initrd_url: url(&self.initrd),
            rootfs_url: self.rootfs.as_deref().map(url).unwrap_or_default(),
            cmdline: self.cmdline.clone(),
        }
    }
}

fn encode_path(p: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(p, SET).to_string()
}

/// A disk image ready to install: where the agent fetches it and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDisk {
    pub reference: String,
    /// Catalog-relative path of the packed image.
    pub path: String,
    /// The raw image's SHA-256 (lowercase).
    pub sha256: String,
    pub raw_size: u64,
    /// The catalog's root-device hints as compact JSON (`{}` when none).
    pub root_device_hints: String,
}

impl ResolvedDisk {
    /// The packed image's URL under `<base_url>/assets/images/`.
    pub fn image_url(&self, base_url: &str) -> String {
        format!(
            "{}/assets/images/{}",
            base_url.trim_end_matches('/'),
            encode_path(&self.path)
        )
    }
}

/// What a disk image's manifest says (the fields resolution checks).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ManifestFacts {
    pub format: String,
    pub sha256: String,
    pub raw_size: u64,
}

/// A manifest as last read: its size, mtime and what it said (or why it did not parse).
type ManifestEntry = (u64, SystemTime, Result<ManifestFacts, String>);

/// Largest manifest read (a 1 TiB image in 4 MiB frames lists 262,144 frames).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// What is known about one catalog file: absent, or present with this digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFact {
    Missing,
    Present { sha256: String },
}

/// Answers "what is at this catalog-relative path?".
pub trait FileFacts {
    fn fact(&self, path: &str) -> FileFact;
}

impl FileFacts for HashMap<String, FileFact> {
    fn fact(&self, path: &str) -> FileFact {
        self.get(path).cloned().unwrap_or(FileFact::Missing)
    }
}

impl Catalog {
    /// Parse and validate catalog text.
    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let c: Catalog = toml::from_str(text)
            .map_err(|e| CatalogError::Parse(e.to_string().trim_end().to_string()))?;
        let mut seen = std::collections::HashSet::new();
        for d in &c.disks {
            if !seen.insert(d.reference.as_str()) {
                return Err(CatalogError::Duplicate(d.reference.clone()));
            }
            check_disk(d)?;
        }
        for img in &c.images {
            if !seen.insert(img.reference.as_str()) {
                return Err(CatalogError::Duplicate(img.reference.clone()));
            }
            for (role, f) in img.files() {
                if !safe_relative(&f.path) {
                    return Err(CatalogError::BadPath {
                        image: img.reference.clone(),
                        role,
                        path: f.path.clone(),
                    });
                }
                if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(CatalogError::BadDigest {
                        image: img.reference.clone(),
                        role,
                    });
                }
            }
        }
        Ok(c)
    }

    pub(crate) fn get(&self, reference: &str) -> Option<&ImageEntry> {
        self.images.iter().find(|i| i.reference == reference)
    }

    /// The disk image `reference`, when it is one.
    pub fn disk(&self, reference: &str) -> Option<&DiskEntry> {
        self.disks.iter().find(|d| d.reference == reference)
    }

    /// Ready to install (the manifest beside the packed image names the pinned raw
    /// SHA-256) or why not. `manifest` reads `<path>.manifest.json`: `None` when absent,
    /// `Some(Err(why))` when it does not parse.
    pub fn resolve_disk(
        &self,
        reference: &str,
        manifest: &dyn Fn(&str) -> Option<Result<ManifestFacts, String>>,
    ) -> Result<ResolvedDisk, ImageError> {
        let d = self
            .disk(reference)
            .ok_or_else(|| ImageError::UnknownImage(reference.to_string()))?;
        let mpath = format!("{}.manifest.json", d.path);
        let bad = |why: String| ImageError::BadManifest {
            image: d.reference.clone(),
            path: mpath.clone(),
            why,
        };
        let m = match manifest(&mpath) {
            None => {
                return Err(ImageError::MissingFile {
                    image: d.reference.clone(),
                    role: "manifest",
                    path: mpath,
                })
            }
            Some(Err(why)) => return Err(bad(why)),
            Some(Ok(m)) => m,
        };
        if m.format != "bootplane-image/1" {
            return Err(bad(format!(
                "format {:?}, expected \"bootplane-image/1\"",
                m.format
            )));
        }
        if !m.sha256.eq_ignore_ascii_case(&d.sha256) {
            return Err(ImageError::ChecksumMismatch {
                image: d.reference.clone(),
                role: "disk",
                path: d.path.clone(),
                expected: d.sha256.to_ascii_lowercase(),
                actual: m.sha256.to_ascii_lowercase(),
            });
        }
        let hints = d
            .root_device_hints
            .as_ref()
            .map(|t| serde_json::to_string(t).unwrap_or_else(|_| "{}".into()))
            .unwrap_or_else(|| "{}".into());
        Ok(ResolvedDisk {
            reference: d.reference.clone(),
            path: d.path.clone(),
            sha256: d.sha256.to_ascii_lowercase(),
            raw_size: m.raw_size,
            root_device_hints: hints,
        })
    }

    /// Ready (every file present with the listed digest) or the first thing missing.
    pub fn resolve(
        &self,
        reference: &str,
        facts: &dyn FileFacts,
    ) -> Result<ResolvedImage, ImageError> {
        let img = self
            .get(reference)
            .ok_or_else(|| ImageError::UnknownImage(reference.to_string()))?;
        for (role, f) in img.files() {
            match facts.fact(&f.path) {
                FileFact::Missing => {
                    return Err(ImageError::MissingFile {
                        image: img.reference.clone(),
                        role,
                        path: f.path.clone(),
                    })
                }
                FileFact::Present { sha256 } if !sha256.eq_ignore_ascii_case(&f.sha256) => {
                    return Err(ImageError::ChecksumMismatch {
                        image: img.reference.clone(),
                        role,
                        path: f.path.clone(),
                        expected: f.sha256.to_ascii_lowercase(),
                        actual: sha256,
                    })
                }
                FileFact::Present { .. } => {}
            }
        }
        Ok(ResolvedImage {
            reference: img.reference.clone(),
            arch: img.arch.clone(),
            cmdline: img.cmdline.clone(),
            kernel: img.kernel.path.clone(),
            initrd: img.initrd.path.clone(),
            rootfs: img.rootfs.as_ref().map(|f| f.path.clone()),
        })
    }
}

impl ImageEntry {
    fn files(&self) -> Vec<(&'static str, &FileRef)> {
        let mut v = vec![("kernel", &self.kernel), ("initrd", &self.initrd)];
        if let Some(r) = &self.rootfs {
            v.push(("rootfs", r));
        }
        v
    }
}

/// The root-device hint keys the agent knows (Ironic's `rootDeviceHints`).
const HINT_KEYS: [&str; 9] = [
    "name",
    "wwn",
    "serial",
    "vendor",
    "model",
    "size",
    "rotational",
    "by_path",
    "hctl",
];

/// Root-device hints given as JSON text (a Server's annotation): a JSON object of known
/// keys, at most [`MAX_HINTS_BYTES`] compact; the compact JSON, or why not.
pub fn hints_json(text: &str) -> Result<String, String> {
    if text.len() > 4 * MAX_HINTS_BYTES {
        return Err(format!("longer than {MAX_HINTS_BYTES} bytes"));
    }
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    if let Some(k) = v.keys().find(|k| !HINT_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "unknown hint {k:?} (known: {})",
            HINT_KEYS.join(", ")
        ));
    }
    let json = serde_json::to_string(&v).map_err(|e| e.to_string())?;
    if json.len() > MAX_HINTS_BYTES {
        return Err(format!("longer than {MAX_HINTS_BYTES} bytes"));
    }
    Ok(json)
}

/// A `[[disk]]` entry's path, digest and hints (bounded: they go on a kernel command line).
fn check_disk(d: &DiskEntry) -> Result<(), CatalogError> {
    if !safe_relative(&d.path) {
        return Err(CatalogError::BadPath {
            image: d.reference.clone(),
            role: "disk",
            path: d.path.clone(),
        });
    }
    if d.sha256.len() != 64 || !d.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(CatalogError::BadDigest {
            image: d.reference.clone(),
            role: "disk",
        });
    }
    if let Some(h) = &d.root_device_hints {
        let bad = |why: &str| CatalogError::BadHints {
            image: d.reference.clone(),
            why: why.to_string(),
        };
        if let Some(k) = h.keys().find(|k| !HINT_KEYS.contains(&k.as_str())) {
            return Err(bad(&format!(
                "unknown hint {k:?} (known: {})",
                HINT_KEYS.join(", ")
            )));
        }
        let json = serde_json::to_string(h).map_err(|e| bad(&e.to_string()))?;
        if json.len() > MAX_HINTS_BYTES {
            return Err(bad(&format!("longer than {MAX_HINTS_BYTES} bytes")));
        }
    }
    Ok(())
}

/// A catalog path the boot listener can serve under `/assets/images/` (the rules of
/// `files::sanitize`): relative, no empty segment, no segment starting with `.` (so no
/// `..` and no hidden files), no `\`, `%` or control characters.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains(['\\', '%'])
        && !p.chars().any(char::is_control)
        && p.split('/').all(|s| !s.is_empty() && !s.starts_with('.'))
}

/// Hashes catalog files under one directory, caching by (size, mtime).
pub struct FileHasher {
    root: PathBuf,
    cache: Mutex<HashMap<PathBuf, (u64, SystemTime, String)>>,
    /// Disk image manifests read, by (size, mtime): the boot side resolves a claimed
    /// disk image on every refresh of its Server, and a manifest may be megabytes.
    manifests: Mutex<HashMap<PathBuf, ManifestEntry>>,
}

impl FileHasher {
    pub fn new(root: impl Into<PathBuf>) -> FileHasher {
        FileHasher {
            root: root.into(),
            cache: Mutex::new(HashMap::new()),
            manifests: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// SHA-256 (lowercase hex) of a catalog-relative path; `Ok(None)` when absent.
    pub fn sha256(&self, rel: &str) -> std::io::Result<Option<String>> {
        if !safe_relative(rel) {
            return Ok(None);
        }
        let path = self.root.join(rel);
        let meta = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let key = (meta.len(), meta.modified()?);
        if let Some((len, mtime, digest)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&path)
        {
            if (*len, *mtime) == key {
                return Ok(Some(digest.clone()));
            }
        }
        let mut f = std::fs::File::open(&path)?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h)?;
        let digest = hex::encode(h.finalize());
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path, (key.0, key.1, digest.clone()));
        Ok(Some(digest))
    }

    /// Resolve `reference` against the files on disk (hashing what changed).
    pub fn resolve(
        &self,
        catalog: &Catalog,
        reference: &str,
    ) -> std::io::Result<Result<ResolvedImage, ImageError>> {
        let mut facts = HashMap::new();
        if let Some(img) = catalog.get(reference) {
            for (_, f) in img.files() {
                let fact = match self.sha256(&f.path)? {
                    Some(sha256) => FileFact::Present { sha256 },
                    None => FileFact::Missing,
                };
                facts.insert(f.path.clone(), fact);
            }
        }
        Ok(catalog.resolve(reference, &facts))
    }
}

impl FileHasher {
    /// Resolve disk image `reference` against its manifest on disk.
    pub fn resolve_disk(
        &self,
        catalog: &Catalog,
        reference: &str,
    ) -> Result<ResolvedDisk, ImageError> {
        let read = |rel: &str| -> Option<Result<ManifestFacts, String>> {
            if !safe_relative(rel) {
                return None;
            }
            let path = self.root.join(rel);
            let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
            let key = (meta.len(), meta.modified().ok()?);
            let mut cache = self.manifests.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((len, mtime, facts)) = cache.get(&path) {
                if (*len, *mtime) == key {
                    return Some(facts.clone());
                }
            }
            let facts = if meta.len() > MAX_MANIFEST_BYTES {
                Err(format!("larger than {MAX_MANIFEST_BYTES} bytes"))
            } else {
                std::fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            };
            cache.insert(path, (key.0, key.1, facts.clone()));
            Some(facts)
        };
        catalog.resolve_disk(reference, &read)
    }
}

/// Read and parse `<dir>/catalog.toml` (an absent file is an empty catalog).
pub fn load(dir: &Path) -> anyhow::Result<Catalog> {
    use anyhow::Context as _;
    let path = dir.join(CATALOG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Catalog::parse(&text)
            .with_context(|| format!("reading image catalog {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Catalog::default()),
        Err(e) => Err(e).with_context(|| format!("reading image catalog {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn text() -> String {
        format!(
            "[[image]]\nref = \"os-image:latest\"\ncmdline = \"rd.neednet=1\"\nkernel = {{ path = \"os/vmlinuz\", sha256 = \"{A}\" }}\ninitrd = {{ path = \"os/initrd\", sha256 = \"{B}\" }}\n"
        )
    }

    #[test]
    fn resolve_ready_and_each_error() {
        let c = Catalog::parse(&text()).unwrap();
        let mut facts: HashMap<String, FileFact> = HashMap::new();
        assert_eq!(
            c.resolve("nope:1", &facts),
            Err(ImageError::UnknownImage("nope:1".into()))
        );
        let e = c.resolve("os-image:latest", &facts).unwrap_err();
        assert_eq!(e.reason(), "MissingFile");
        assert!(
            e.to_string().contains("kernel file os/vmlinuz is missing"),
            "{e}"
        );
        facts.insert("os/vmlinuz".into(), FileFact::Present { sha256: A.into() });
        facts.insert("os/initrd".into(), FileFact::Present { sha256: A.into() });
        let e = c.resolve("os-image:latest", &facts).unwrap_err();
        assert_eq!(e.reason(), "ChecksumMismatch");
        assert!(e.to_string().contains("initrd"), "{e}");
        facts.insert(
            "os/initrd".into(),
            FileFact::Present {
                sha256: B.to_uppercase(),
            },
        );
        let r = c.resolve("os-image:latest", &facts).unwrap();
        assert_eq!(r.arch, "amd64");
        let f = r.boot_files("http://h:1/");
        assert_eq!(f.kernel_url, "http://h:1/assets/images/os/vmlinuz");
        assert_eq!(f.rootfs_url, "");
    }

    #[test]
    fn disk_images_resolve_against_their_manifest() {
        let disk = format!(
            "[[disk]]\nref = \"deb:disk\"\npath = \"deb/disk.zst\"\nsha256 = \"{A}\"\nroot_device_hints = {{ size = \">= 8\", rotational = false }}\n"
        );
        let c = Catalog::parse(&disk).unwrap();
        let m = |sha: &str| {
            let sha = sha.to_string();
            move |p: &str| {
                assert_eq!(p, "deb/disk.zst.manifest.json");
                Some(Ok(ManifestFacts {
                    format: "bootplane-image/1".into(),
                    sha256: sha.clone(),
                    raw_size: 1 << 30,
                }))
            }
        };
        let r = c.resolve_disk("deb:disk", &m(A)).unwrap();
        assert_eq!(r.raw_size, 1 << 30);
        assert_eq!(r.root_device_hints, r#"{"rotational":false,"size":">= 8"}"#);
        assert_eq!(
            r.image_url("http://h:1"),
            "http://h:1/assets/images/deb/disk.zst"
        );
        let e = c.resolve_disk("deb:disk", &m(B)).unwrap_err();
        assert_eq!(e.reason(), "ChecksumMismatch");
        let e = c.resolve_disk("deb:disk", &|_| None).unwrap_err();
        assert_eq!(e.reason(), "MissingFile");
        assert!(
            e.to_string()
                .contains("manifest file deb/disk.zst.manifest.json"),
            "{e}"
        );
        let e = c
            .resolve_disk("deb:disk", &|_| Some(Err("eof".into())))
            .unwrap_err();
        assert_eq!(e.reason(), "BadManifest");
        assert!(c.resolve_disk("os:1", &m(A)).is_err());
        // Bad entries are named.
        let bad = |t: String| Catalog::parse(&t).unwrap_err().to_string();
        assert!(bad(format!(
            "[[disk]]\nref = \"d\"\npath = \"../x\"\nsha256 = \"{A}\"\n"
        ))
        .contains("disk path"));
        assert!(
            bad("[[disk]]\nref = \"d\"\npath = \"x\"\nsha256 = \"12\"\n".into())
                .contains("disk sha256")
        );
        assert!(bad(format!("[[disk]]\nref = \"d\"\npath = \"x\"\nsha256 = \"{A}\"\nroot_device_hints = {{ colour = \"red\" }}\n")).contains("unknown hint"));
        let long = "s".repeat(2000);
        assert!(bad(format!("[[disk]]\nref = \"d\"\npath = \"x\"\nsha256 = \"{A}\"\nroot_device_hints = {{ serial = \"{long}\" }}\n")).contains("longer than"));
        // A Server's hints: a bounded object of known keys.
        assert_eq!(
            hints_json(r#"{ "serial": "S1" }"#).unwrap(),
            r#"{"serial":"S1"}"#
        );
        assert!(hints_json(r#"{"colour": 1}"#)
            .unwrap_err()
            .contains("unknown hint"));
        assert!(hints_json("[1]").unwrap_err().contains("not a JSON object"));
        assert!(hints_json(&format!(r#"{{"serial": "{long}"}}"#))
            .unwrap_err()
            .contains("longer"));
        // A disk and an image may not share a reference.
        let both = format!("{disk}{}", text().replace("os-image:latest", "deb:disk"));
        assert!(Catalog::parse(&both)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    #[test]
    fn bad_catalogs_are_named() {
        assert!(matches!(
            Catalog::parse("[[image]]\nref = 1\n"),
            Err(CatalogError::Parse(_))
        ));
        let bad = text().replace("os/vmlinuz", "../etc/passwd");
        assert!(matches!(
            Catalog::parse(&bad),
            Err(CatalogError::BadPath { role: "kernel", .. })
        ));
        let bad = text().replace(A, "abc");
        assert!(matches!(
            Catalog::parse(&bad),
            Err(CatalogError::BadDigest { .. })
        ));
        let twice = format!("{}{}", text(), text());
        assert!(matches!(
            Catalog::parse(&twice),
            Err(CatalogError::Duplicate(_))
        ));
    }

    /// Found by the `catalog_toml` fuzz target: these paths were accepted, the image
    /// became Ready, and the boot listener then refused every URL built from them (400),
    /// so the machine could not boot. A catalog path must be one `/assets/` serves.
    #[test]
    fn paths_the_boot_listener_refuses_are_refused() {
        for p in [
            "os/vml%z",
            "os/a%2fb",
            ".hidden/vmlinuz",
            "os/.vmlinuz",
            "os/a\\tb",
            "os/a\\u0001b",
        ] {
            let bad = text().replace("os/vmlinuz", p);
            assert!(
                matches!(
                    Catalog::parse(&bad),
                    Err(CatalogError::BadPath { role: "kernel", .. })
                ),
                "{p:?} accepted"
            );
        }
        // What the listener serves stays accepted, and its URL maps back to the path.
        let ok = text().replace("os/vmlinuz", "os/vm linuz+1~_-.img");
        let c = Catalog::parse(&ok).unwrap();
        let r = c.get("os-image:latest").unwrap();
        let facts: HashMap<String, FileFact> = [(&r.kernel, A), (&r.initrd, B)]
            .into_iter()
            .map(|(f, h)| (f.path.clone(), FileFact::Present { sha256: h.into() }))
            .collect();
        let url = c
            .resolve("os-image:latest", &facts)
            .unwrap()
            .boot_files("http://h:1")
            .kernel_url;
        let raw = url.strip_prefix("http://h:1/assets/").unwrap();
        assert_eq!(
            crate::http::files::sanitize(raw).unwrap(),
            "images/os/vm linuz+1~_-.img"
        );
    }

    #[test]
    fn hasher_hashes_and_caches() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("os")).unwrap();
        std::fs::write(dir.path().join("os/vmlinuz"), b"kernel").unwrap();
        let h = FileHasher::new(dir.path());
        let want = hex::encode(Sha256::digest(b"kernel"));
        assert_eq!(h.sha256("os/vmlinuz").unwrap(), Some(want.clone()));
        assert_eq!(h.sha256("os/vmlinuz").unwrap(), Some(want));
        assert_eq!(h.sha256("os/initrd").unwrap(), None);
        assert_eq!(h.sha256("../x").unwrap(), None);
        let c = Catalog::parse(&text()).unwrap();
        assert_eq!(
            h.resolve(&c, "os-image:latest")
                .unwrap()
                .unwrap_err()
                .reason(),
            "ChecksumMismatch"
        );
    }

    #[test]
    fn shipped_catalog_parses() {
        let c = Catalog::parse(include_str!("../../../../images/catalog.toml")).unwrap();
        assert!(c.get("os-image:latest").is_some());
    }
}
