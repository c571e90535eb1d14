//! What a provisioning job the appliance runs may read and write (`[provision.jobs]`):
//! the job API and the ServerAction reconciler hand every request to [`Guarded`], which
//! refuses it unless
//!
//! - `target` matches one of the block-device globs ([`JobsConfig::target_devices`],
//!   by default `/dev/disk/by-id/*` and `/dev/disk/by-path/*`) or lies in the directory
//!   for regular-file targets ([`JobsConfig::target_dir`], none by default). With the
//!   local runner the target is resolved on this host: a device link must resolve to a
//!   block device, a file target's directory must resolve inside `target_dir` and the
//!   file itself must not be a symbolic link. The job gets the resolved path and
//!   `--no-follow-target`, so `bootplane provision` opens it with `O_NOFOLLOW`;
//! - the image comes from the appliance's own NFS server (`provision.nfs_server`) or
//!   from below one of [`JobsConfig::sources`] (`nfs://server/export/` or
//!   `http(s)://host/base/`): no local paths, no other hosts;
//! - a pinned `sha256` is given (the manifest beside the image is read over the same
//!   channel as the image, so it proves nothing by itself).
//!
//! Refusals are [`JobError::Forbidden`] (422 on the job API). `bootplane provision` run
//! by hand is not subject to any of this.

use std::os::unix::fs::FileTypeExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt as _;
use serde::{Deserialize, Serialize};

use super::{JobError, JobId, JobRunner, JobStatus, ProvisionRequest};

/// `[provision.jobs]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JobsConfig {
    /// Globs of the block devices a job may write (`*` and `?` never match `/`).
    pub target_devices: Vec<String>,
    /// Directory in which a job may write regular files (its subdirectories too).
    /// None (default): no file targets.
    pub target_dir: Option<PathBuf>,
    /// Source bases besides the appliance's own NFS server: `nfs://server/export` or
    /// `http(s)://host[:port]/path`; a job's source must lie below one of them.
    pub sources: Vec<String>,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            target_devices: vec!["/dev/disk/by-id/*".into(), "/dev/disk/by-path/*".into()],
            target_dir: None,
            sources: Vec::new(),
        }
    }
}

impl JobsConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        for g in &self.target_devices {
            if !g.starts_with("/dev/") || has_dots(Path::new(g)) {
                anyhow::bail!(
                    "provision.jobs.target_devices: {g:?} must be an absolute glob below /dev/ without . or .."
                );
            }
        }
        if let Some(d) = &self.target_dir {
            let t = d.to_string_lossy();
            let t = t.trim_end_matches('/');
            if t.is_empty() || has_dots(Path::new(t)) {
                anyhow::bail!(
                    "provision.jobs.target_dir {} must be an absolute directory other than / without . or ..",
                    d.display()
                );
            }
        }
        for s in &self.sources {
            let ok = ["nfs://", "http://", "https://"]
                .iter()
                .any(|p| s.strip_prefix(p).is_some_and(|r| !r.is_empty()));
            if !ok || s.contains(['?', '#', '\\']) || dotted(s) {
                anyhow::bail!(
                    "provision.jobs.sources: {s:?} must be an nfs://, http:// or https:// base without query or dot segments"
                );
            }
        }
        Ok(())
    }
}

/// A path with a `.` or `..` component, an empty one (`//`, a trailing `/`), or not
/// absolute.
fn has_dots(p: &Path) -> bool {
    let s = p.to_string_lossy();
    !s.starts_with('/')
        || s.len() > 1
            && s[1..]
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        || p.components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
}

/// A URL path with a `.` or `..` segment, plain or percent-encoded.
fn dotted(s: &str) -> bool {
    let path = s.split(['?', '#']).next().unwrap_or("");
    path.split('/').any(|seg| {
        let d = seg.to_ascii_lowercase().replace("%2e", ".");
        d == "." || d == ".."
    }) || path.to_ascii_lowercase().contains("%2f")
}

/// `*` matches any run of characters but `/`, `?` one character but `/`; everything
/// else matches itself.
pub(crate) fn glob_match(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == s[si] || (p[pi] == b'?' && s[si] != b'/')) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star.filter(|&(_, ss)| s[ss] != b'/') {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Whether `base` (a configured source base) covers `source`: the same text up to a
/// `/` boundary, and nothing below it that climbs out.
fn under_base(base: &str, source: &str) -> bool {
    let base = base.trim_end_matches('/');
    source
        .strip_prefix(base)
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
        && !dotted(source)
        && !source.contains('\\')
}

/// Where the job checks its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    /// On this host (the local runner): resolve it here.
    Here,
    /// Elsewhere (a node of a cluster): the path as written is all there is to check.
    Elsewhere,
}

/// The allow-lists with what they are checked against.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub jobs: JobsConfig,
    /// `provision.nfs_server`: NFS sources on it are the appliance's own exports.
    pub nfs_server: String,
    pub place: Where,
}

fn forbidden(m: String) -> JobError {
    JobError::Forbidden(m)
}

impl Policy {
    /// The request as the job should run it (with the target resolved where it is
    /// checked here), or why it may not run.
    pub(crate) fn check(&self, req: &ProvisionRequest) -> Result<ProvisionRequest, JobError> {
        req.validate()?;
        if req.sha256.is_none() {
            return Err(forbidden(
                "sha256 is required: a job writes only an image pinned by its checksum".into(),
            ));
        }
        self.check_source(req)?;
        let mut out = req.clone();
        if let Some(t) = self.check_target(&req.target)? {
            out.resolved_target = Some(t);
        }
        Ok(out)
    }

    fn check_source(&self, req: &ProvisionRequest) -> Result<(), JobError> {
        if let Some(n) = &req.nfs {
            if n.server.eq_ignore_ascii_case(&self.nfs_server) {
                return Ok(());
            }
        }
        let src = req.source_arg();
        if self.jobs.sources.iter().any(|b| under_base(b, &src)) {
            return Ok(());
        }
        Err(forbidden(format!(
            "source {} is neither on provision.nfs_server nor below one of provision.jobs.sources",
            crate::image::source::shown(&src)
        )))
    }

    /// `Some(resolved path)` when the target was resolved here.
    fn check_target(&self, target: &str) -> Result<Option<String>, JobError> {
        let path = Path::new(target);
        let refuse = |why: &str| {
            Err(forbidden(format!(
                "target {target:?} {why} (provision.jobs.target_devices, provision.jobs.target_dir)"
            )))
        };
        if has_dots(path) {
            return refuse("must be an absolute path without ., .. or empty components");
        }
        if self
            .jobs
            .target_devices
            .iter()
            .any(|g| glob_match(g, target))
        {
            if self.place == Where::Elsewhere {
                return Ok(None);
            }
            let real = match std::fs::canonicalize(path) {
                Ok(r) => r,
                Err(e) => return refuse(&format!("cannot be resolved: {e}")),
            };
            let block = std::fs::metadata(&real).is_ok_and(|m| m.file_type().is_block_device());
            if !block || !real.starts_with("/dev/") {
                return refuse("does not resolve to a block device");
            }
            return Ok(Some(real.display().to_string()));
        }
        let Some(dir) = &self.jobs.target_dir else {
            return refuse("is not an allowed block device and file targets are not configured");
        };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return refuse("names no file");
        };
        if !path.starts_with(dir) || path == dir {
            return refuse("is outside the allowed devices and the file target directory");
        }
        if self.place == Where::Elsewhere {
            return Ok(None);
        }
        let (Ok(real_dir), Ok(real_parent)) =
            (std::fs::canonicalize(dir), std::fs::canonicalize(parent))
        else {
            return refuse("is in a directory that does not exist");
        };
        if !real_parent.starts_with(&real_dir) {
            return refuse("resolves outside the file target directory");
        }
        let real = real_parent.join(name);
        match std::fs::symlink_metadata(&real) {
            Ok(m) if !m.file_type().is_file() => refuse("exists and is not a regular file"),
            Ok(_) => Ok(Some(real.display().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Some(real.display().to_string()))
            }
            Err(e) => refuse(&format!("cannot be read: {e}")),
        }
    }
}

/// A runner that starts only what [`Policy`] allows (see the module doc).
pub(crate) struct Guarded {
    inner: Arc<dyn JobRunner>,
    policy: Policy,
}

impl Guarded {
    pub(crate) fn new(inner: Arc<dyn JobRunner>, policy: Policy) -> Guarded {
        Guarded { inner, policy }
    }
}

impl JobRunner for Guarded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn start(&self, req: ProvisionRequest) -> BoxFuture<'_, Result<JobId, JobError>> {
        async move {
            let req = self.policy.check(&req)?;
            self.inner.start(req).await
        }
        .boxed()
    }

    fn status<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<JobStatus, JobError>> {
        self.inner.status(id)
    }

    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), JobError>> {
        self.inner.cancel(id)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, JobError>> {
        self.inner.list()
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
