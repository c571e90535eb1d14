//! Ignition rendering: Butane → Ignition translation, per-machine templates,
//! validation. Pure: no I/O while rendering.
//!
//! - [`butane`] translates Butane YAML (variants `fcos` 1.3–1.6 → Ignition 3.2–3.5 and
//!   `flatcar` 1.0–1.1 → Ignition 3.3–3.4) into Ignition JSON. Local files
//!   (`contents.local`, `storage.trees`, `ssh_authorized_keys_local`) come from a
//!   [`FilesDir`] the caller fills in; the translator itself never touches the disk.
//! - [`validate`] checks an Ignition config against the embedded JSON schema of its
//!   version plus Ignition's semantic rules (absolute paths, unique paths, modes,
//!   URLs, hashes, unit names).
//! - [`render`] fills operator templates (`ignition/`) with [`MachineFacts`] via
//!   minijinja, merges the claim's ignition secret on top and caches the result in a
//!   [`RenderCache`].
//! - [`templates`] is the template directory as the boot side uses it: reload on
//!   change, and the rule that picks a machine's template.
//! - `bootplane render ignition|ipxe` (the command) is `crate::cli::render`.
//!
//! Errors carry the field path (`storage.files[2].mode`) and, for YAML input, the line
//! and column, so they can go straight into a ServerBootConfiguration's `Error` condition.
//!
//! The YAML → struct mapping uses serde (serde_norway, whose errors carry path and line);
//! a second, error-path-only pass with yaml-rust2's event markers maps a field path to
//! its line for the semantic errors found after deserialisation.

pub mod butane;
mod deflate;
mod locate;
pub mod merge;
pub mod render;
pub mod templates;
pub mod validate;

use std::collections::BTreeMap;
use std::fmt;

pub use butane::{translate, translate_with, Translated};
pub use render::{
    IgnitionSecret, MachineFacts, RenderCache, RenderKey, Rendered, Renderer, Template,
};
pub use validate::validate;

/// An Ignition config spec version this module emits and validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IgnVersion {
    V3_2,
    V3_3,
    V3_4,
    V3_5,
}

impl IgnVersion {
    /// Every supported version, oldest first.
    pub const ALL: [IgnVersion; 4] = [
        IgnVersion::V3_2,
        IgnVersion::V3_3,
        IgnVersion::V3_4,
        IgnVersion::V3_5,
    ];

    /// The `ignition.version` string, e.g. `3.4.0`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IgnVersion::V3_2 => "3.2.0",
            IgnVersion::V3_3 => "3.3.0",
            IgnVersion::V3_4 => "3.4.0",
            IgnVersion::V3_5 => "3.5.0",
        }
    }

    /// Parses an `ignition.version` string; only the stable 3.2.0–3.5.0 are accepted.
    pub(crate) fn parse(s: &str) -> Option<IgnVersion> {
        IgnVersion::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl fmt::Display for IgnVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem in a config: where (field path, and line/column for YAML input) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Field path in the input, e.g. `storage.files[2].path` (empty for the document root).
    pub path: String,
    /// 1-based line and column in the input, when known.
    pub line: Option<(usize, usize)>,
    pub message: String,
}

impl Issue {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Issue {
        Issue {
            path: path.into(),
            line: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(root)"
        } else {
            &self.path
        };
        match self.line {
            Some((l, c)) => write!(f, "{path} (line {l}, column {c}): {}", self.message),
            None => write!(f, "{path}: {}", self.message),
        }
    }
}

/// Why a config could not be translated, rendered or validated.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The YAML could not be parsed or does not match Butane's structure (unknown field,
    /// wrong type); the message names the field path, line and column.
    #[error("invalid butane: {0}")]
    Yaml(String),
    /// The JSON could not be parsed; the message carries line and column.
    #[error("invalid ignition json: {0}")]
    Json(String),
    #[error("unknown butane variant {0:?} (supported: fcos, flatcar)")]
    UnknownVariant(String),
    #[error("unsupported {variant} version {version:?} (supported: {supported})")]
    UnsupportedVersion {
        variant: String,
        version: String,
        supported: &'static str,
    },
    #[error("unsupported ignition version {0:?} (supported: 3.2.0, 3.3.0, 3.4.0, 3.5.0)")]
    UnsupportedIgnitionVersion(String),
    /// Structurally valid but semantically wrong (or unsupported) fields.
    #[error("{}", join_issues(.0))]
    Invalid(Vec<Issue>),
    /// A template failed to render (syntax error, undefined variable, ...).
    #[error("template {name}: {message}")]
    Template { name: String, message: String },
    /// The ignition secret is unusable (missing key, unknown format).
    #[error("ignition secret: {0}")]
    Secret(String),
}

impl Error {
    /// A short CamelCase reason for a ServerBootConfiguration `Error` condition (the
    /// message is `to_string()`).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Yaml(_) | Error::UnknownVariant(_) | Error::UnsupportedVersion { .. } => {
                "InvalidButane"
            }
            Error::Json(_) | Error::UnsupportedIgnitionVersion(_) => "InvalidIgnition",
            Error::Invalid(_) => "InvalidConfig",
            Error::Template { .. } => "TemplateError",
            Error::Secret(_) => "InvalidIgnitionSecret",
        }
    }

    /// The individual issues, when this is an [`Error::Invalid`].
    pub fn issues(&self) -> &[Issue] {
        match self {
            Error::Invalid(v) => v,
            _ => &[],
        }
    }
}

fn join_issues(v: &[Issue]) -> String {
    v.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A local file the caller supplies for Butane's `local` references (`contents.local`,
/// `storage.trees`, `ssh_authorized_keys_local`, `contents_local`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LocalEntry {
    File { data: Vec<u8>, executable: bool },
    Symlink { target: String },
    Dir,
}

/// The "files directory" of a Butane translation (butane's `--files-dir`), as data:
/// relative path (with `/` separators, no leading `/`) → entry. The CLI fills it from
/// disk; the server from wherever it keeps them; the translator only looks things up.
#[derive(Debug, Clone, Default)]
pub struct FilesDir {
    entries: BTreeMap<String, LocalEntry>,
}

impl FilesDir {
    pub fn new() -> FilesDir {
        FilesDir::default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a regular file.
    pub fn file(&mut self, rel: &str, data: impl Into<Vec<u8>>, executable: bool) -> &mut Self {
        self.entries.insert(
            clean_rel(rel),
            LocalEntry::File {
                data: data.into(),
                executable,
            },
        );
        self
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, rel: &str, target: &str) -> &mut Self {
        self.entries.insert(
            clean_rel(rel),
            LocalEntry::Symlink {
                target: target.to_string(),
            },
        );
        self
    }

    /// Adds an (empty) directory.
    pub fn dir(&mut self, rel: &str) -> &mut Self {
        self.entries.insert(clean_rel(rel), LocalEntry::Dir);
        self
    }

    pub(crate) fn get(&self, rel: &str) -> Option<&LocalEntry> {
        self.entries.get(&clean_rel(rel))
    }

    /// Every entry strictly below `dir` (relative path from `dir`, entry), sorted.
    pub(crate) fn under<'a>(
        &'a self,
        dir: &str,
    ) -> impl Iterator<Item = (&'a str, &'a LocalEntry)> + 'a {
        let d = clean_rel(dir);
        let prefix = if d.is_empty() {
            String::new()
        } else {
            format!("{d}/")
        };
        self.entries.iter().filter_map(move |(k, v)| {
            k.strip_prefix(prefix.as_str())
                .filter(|r| !r.is_empty())
                .map(|r| (r, v))
        })
    }

    /// Reads a directory tree from disk into a `FilesDir` (used by the CLI, never by
    /// the translator). Symlinks are recorded, not followed.
    pub fn read_dir(root: &std::path::Path) -> anyhow::Result<FilesDir> {
        use anyhow::Context;
        use std::os::unix::fs::PermissionsExt;
        let mut out = FilesDir::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let rd =
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
            for ent in rd {
                let ent = ent.with_context(|| format!("reading {}", dir.display()))?;
                let p = ent.path();
                let rel = p
                    .strip_prefix(root)
                    .context("walking files dir")?
                    .to_string_lossy()
                    .replace('\\', "/");
                let md = std::fs::symlink_metadata(&p)
                    .with_context(|| format!("reading {}", p.display()))?;
                if md.file_type().is_symlink() {
                    let t = std::fs::read_link(&p)
                        .with_context(|| format!("reading link {}", p.display()))?;
                    out.symlink(&rel, &t.to_string_lossy());
                } else if md.is_dir() {
                    out.dir(&rel);
                    stack.push(p);
                } else {
                    let data =
                        std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
                    out.file(&rel, data, md.permissions().mode() & 0o111 != 0);
                }
            }
        }
        Ok(out)
    }
}

fn clean_rel(p: &str) -> String {
    p.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}
