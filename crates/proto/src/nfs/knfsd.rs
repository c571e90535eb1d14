//! Export backend for the Linux kernel NFS server: one file per export in
//! `/etc/exports.d/bootplane-<name>.exports`, applied with `exportfs -r`.
//!
//! An exports line without clients would export to the world, so an export with no
//! rules has no file at all (the kernel server cannot express "exported, nobody
//! allowed"); its path is remembered in a `.bootplane-<name>.path` side file so a
//! later `set_rules` can write the line. Allow rules become client specifications in
//! index order. knfsd has no per-client deny, so a `None` rule is rendered by leaving
//! that client out; and because mountd matches by client type (single hosts before
//! networks) rather than by position, a deny inside a broader allow cannot be
//! expressed: such rule lists are rejected with a clear error. Per-client protocol
//! versions cannot be expressed either (versions are server-wide in `nfs.conf`);
//! rules listing protocols are accepted and the versions ignored. Only the rendering
//! and the file lifecycle are tested here: this machine has no kernel nfsd.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use futures::FutureExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::rules::{RuleDiff, RuleTarget};
use super::{
    normalize_rules, validate_export_name, validate_fs_path, write_atomic, Access, ExportBackend,
    ExportRule, Health, NfsError,
};

/// `[nfs.knfsd]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KnfsdConfig {
    pub exports_dir: PathBuf,
    pub exportfs_bin: String,
}

impl Default for KnfsdConfig {
    fn default() -> Self {
        KnfsdConfig {
            exports_dir: PathBuf::from("/etc/exports.d"),
            exportfs_bin: "exportfs".into(),
        }
    }
}

pub(crate) struct Knfsd {
    cfg: KnfsdConfig,
    lock: tokio::sync::Mutex<()>,
}

impl Knfsd {
    pub(crate) fn new(cfg: KnfsdConfig) -> Self {
        Knfsd {
            cfg,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    fn stem(export: &str) -> String {
        let readable: String = export
            .trim_start_matches('/')
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let h = hex::encode(&Sha256::digest(export.as_bytes())[..4]);
        format!("{readable}-{h}")
    }

    /// `/etc/exports.d/bootplane-<name>.exports`
    pub(crate) fn exports_file(&self, export: &str) -> PathBuf {
        self.cfg
            .exports_dir
            .join(format!("bootplane-{}.exports", Self::stem(export)))
    }

    fn path_file(&self, export: &str) -> PathBuf {
        self.cfg
            .exports_dir
            .join(format!(".bootplane-{}.path", Self::stem(export)))
    }

    fn rules_file(&self, export: &str) -> PathBuf {
        self.cfg
            .exports_dir
            .join(format!(".bootplane-{}.rules.json", Self::stem(export)))
    }

    async fn exportfs(&self) -> Result<(), NfsError> {
        let out = tokio::process::Command::new(&self.cfg.exportfs_bin)
            .arg("-r")
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| NfsError::Down(format!("running {} -r: {e}", self.cfg.exportfs_bin)))?;
        if !out.status.success() {
            return Err(NfsError::Backend(format!(
                "{} -r failed ({}): {}",
                self.cfg.exportfs_bin,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    async fn write_and_apply(
        &self,
        export: &str,
        fs_path: &Path,
        rules: &[ExportRule],
    ) -> Result<(), NfsError> {
        let file = self.exports_file(export);
        match render_exports(export, fs_path, rules)? {
            Some(text) => write_atomic(&file, text.as_bytes())?,
            None => remove(&file)?,
        }
        let json = serde_json::to_vec(rules).map_err(NfsError::backend)?;
        write_atomic(&self.rules_file(export), &json)?;
        self.exportfs().await
    }

    fn read_path(&self, export: &str) -> Result<Option<PathBuf>, NfsError> {
        match std::fs::read_to_string(self.path_file(export)) {
            Ok(s) => Ok(Some(PathBuf::from(s.trim_end_matches('\n')))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(NfsError::Backend(format!(
                "reading {}: {e}",
                self.path_file(export).display()
            ))),
        }
    }

    fn read_rules(&self, export: &str) -> Vec<ExportRule> {
        std::fs::read(self.rules_file(export))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
}

fn remove(p: &Path) -> Result<(), NfsError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NfsError::Backend(format!("removing {}: {e}", p.display()))),
    }
}

/// The exports(5) text for one export, or `None` when no client may access it
/// (then no line may exist, since a line without clients exports to everyone).
pub(crate) fn render_exports(
    export: &str,
    fs_path: &Path,
    rules: &[ExportRule],
) -> Result<Option<String>, NfsError> {
    let rules = normalize_rules(rules.to_vec())?;
    // knfsd chooses the most specific matching client, not the first: an explicit deny
    // can only be honoured by omission, which is wrong if a broader allow covers it.
    for (i, deny) in rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.access == Access::None)
    {
        if let Some(allow) = rules[i + 1..].iter().find(|a| {
            a.access != Access::None
                && a.client.contains(deny.client.addr)
                && a.client.prefix <= deny.client.prefix
        }) {
            return Err(NfsError::InvalidRule(format!(
                "knfsd cannot deny {} (rule {}) inside the broader allow {} (rule {}); use the ganesha backend",
                deny.client, deny.index, allow.client, allow.index
            )));
        }
    }
    let mut specs = Vec::new();
    for r in rules.iter().filter(|r| r.access != Access::None) {
        let mut opts = vec![
            if r.access == Access::Rw { "rw" } else { "ro" },
            if r.superuser {
                "no_root_squash"
            } else {
                "root_squash"
            },
            "sync",
            "no_subtree_check",
            "sec=sys",
        ];
        if r.access == Access::Rw {
            opts.push("secure");
        }
        specs.push(format!("{}({})", r.client, opts.join(",")));
    }
    if specs.is_empty() {
        return Ok(None);
    }
    let mut out = format!("# Written by bootplane for export {export}; edits are overwritten.\n");
    out.push_str(&format!("\"{}\" {}\n", fs_path.display(), specs.join(" ")));
    Ok(Some(out))
}

/// An export (its path file read), with the backend locked.
pub(super) struct OpenExport<'a> {
    knfsd: &'a Knfsd,
    _lock: tokio::sync::MutexGuard<'a, ()>,
    export: &'a str,
    fs_path: PathBuf,
}

impl Knfsd {
    async fn open<'a>(&'a self, export: &'a str) -> Result<OpenExport<'a>, NfsError> {
        let lock = self.lock.lock().await;
        let fs_path = self
            .read_path(export)?
            .ok_or_else(|| NfsError::UnknownExport(export.into()))?;
        Ok(OpenExport {
            knfsd: self,
            _lock: lock,
            export,
            fs_path,
        })
    }
}

/// The rules file records the rules; the exports file is rendered whole and applied
/// with `exportfs -r` on every call, a change or not (as before the shared path: the
/// kernel's table may have been changed behind bootplane's back).
impl RuleTarget for OpenExport<'_> {
    type Applied = ExportRule;

    async fn in_force(&mut self) -> Result<Vec<ExportRule>, NfsError> {
        Ok(self.knfsd.read_rules(self.export))
    }

    fn same(desired: &ExportRule, applied: &ExportRule) -> bool {
        desired == applied
    }

    async fn unchanged(&mut self, rules: &[ExportRule]) -> Result<(), NfsError> {
        self.knfsd
            .write_and_apply(self.export, &self.fs_path, rules)
            .await
    }

    async fn change(
        &mut self,
        rules: &[ExportRule],
        _diff: &RuleDiff<'_, ExportRule>,
    ) -> Result<(), NfsError> {
        self.knfsd
            .write_and_apply(self.export, &self.fs_path, rules)
            .await
    }
}

impl ExportBackend for Knfsd {
    fn name(&self) -> &'static str {
        "knfsd"
    }

    fn ensure_export<'a>(
        &'a self,
        export: &'a str,
        fs_path: &'a Path,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        async move {
            validate_export_name(export)?;
            validate_fs_path(export, fs_path)?;
            let _g = self.lock.lock().await;
            std::fs::create_dir_all(&self.cfg.exports_dir).map_err(|e| {
                NfsError::Backend(format!("creating {}: {e}", self.cfg.exports_dir.display()))
            })?;
            if self.read_path(export)?.as_deref() == Some(fs_path) {
                return Ok(());
            }
            write_atomic(
                &self.path_file(export),
                format!("{}\n", fs_path.display()).as_bytes(),
            )?;
            let rules = self.read_rules(export);
            self.write_and_apply(export, fs_path, &rules).await
        }
        .boxed()
    }

    fn set_rules<'a>(
        &'a self,
        export: &'a str,
        rules: Vec<ExportRule>,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        super::rules::set_rules(rules, self.open(export)).boxed()
    }

    fn remove_export<'a>(&'a self, export: &'a str) -> BoxFuture<'a, Result<(), NfsError>> {
        async move {
            let _g = self.lock.lock().await;
            if self.read_path(export)?.is_none() {
                return Ok(());
            }
            remove(&self.exports_file(export))?;
            remove(&self.rules_file(export))?;
            self.exportfs().await?;
            remove(&self.path_file(export))
        }
        .boxed()
    }

    fn health(&self) -> BoxFuture<'_, Result<Health, NfsError>> {
        async move {
            match std::fs::read_to_string("/proc/fs/nfsd/threads") {
                Ok(t) if t.trim() != "0" => Ok(Health {
                    backend: "knfsd",
                    detail: format!("{} nfsd threads", t.trim()),
                }),
                Ok(_) => Err(NfsError::Down(
                    "kernel nfsd has 0 threads (nfs-server not started)".into(),
                )),
                Err(e) => Err(NfsError::Down(format!(
                    "kernel nfsd not available (/proc/fs/nfsd/threads: {e})"
                ))),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs::Protocol;

    fn rule(index: u32, client: &str, access: Access, superuser: bool) -> ExportRule {
        ExportRule {
            index,
            client: client.parse().unwrap(),
            access,
            protocols: vec![],
            superuser,
        }
    }

    #[test]
    fn renders_one_line_in_index_order() {
        let rules = vec![
            rule(2, "10.0.0.0/24", Access::Ro, false),
            rule(1, "10.0.1.5", Access::Rw, true),
        ];
        let text = render_exports("/images/a", Path::new("/srv/images/a"), &rules)
            .unwrap()
            .unwrap();
        assert_eq!(
            text.lines().nth(1).unwrap(),
            "\"/srv/images/a\" 10.0.1.5(rw,no_root_squash,sync,no_subtree_check,sec=sys,secure) 10.0.0.0/24(ro,root_squash,sync,no_subtree_check,sec=sys)"
        );
        assert!(text.starts_with('#'));
    }

    #[test]
    fn no_rules_means_no_line() {
        assert_eq!(
            render_exports("/a", Path::new("/srv/a"), &[]).unwrap(),
            None
        );
        assert_eq!(
            render_exports(
                "/a",
                Path::new("/srv/a"),
                &[rule(1, "10.0.0.1", Access::None, false)]
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn deny_inside_allow_rejected() {
        let rules = vec![
            rule(1, "10.0.0.5", Access::None, false),
            rule(2, "10.0.0.0/24", Access::Ro, false),
        ];
        let err = render_exports("/a", Path::new("/srv/a"), &rules).unwrap_err();
        assert!(err.to_string().contains("ganesha"), "{err}");
        // A deny that no later allow covers is fine (it is simply omitted).
        let rules = vec![
            rule(1, "10.0.9.5", Access::None, false),
            rule(2, "10.0.0.0/24", Access::Ro, false),
        ];
        let text = render_exports("/a", Path::new("/srv/a"), &rules)
            .unwrap()
            .unwrap();
        assert!(!text.contains("10.0.9.5"));
    }

    #[test]
    fn protocols_are_ignored_not_fatal() {
        let mut r = rule(1, "10.0.0.1", Access::Ro, false);
        r.protocols = vec![Protocol::Nfs3];
        assert!(render_exports("/a", Path::new("/srv/a"), &[r])
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn run_returns_on_shutdown() {
        let c = crate::shutdown::Coordinator::new();
        let h = c.handle();
        let k = std::sync::Arc::new(Knfsd::new(KnfsdConfig::default()));
        let t = tokio::spawn(async move { k.run(h).await });
        assert!(c.drain(std::time::Duration::from_secs(5)).await);
        t.await.unwrap();
    }

    #[tokio::test]
    async fn lifecycle_writes_and_removes_files() {
        let dir = tempfile::tempdir().unwrap();
        let k = Knfsd::new(KnfsdConfig {
            exports_dir: dir.path().join("exports.d"),
            exportfs_bin: "true".into(),
        });
        k.ensure_export("/images/a b", Path::new("/srv/a"))
            .await
            .unwrap_err();
        k.ensure_export("/images/a", Path::new("/srv/a"))
            .await
            .unwrap();
        let f = k.exports_file("/images/a");
        assert!(f
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("bootplane-images_a-"));
        assert!(!f.exists(), "no rules: no exports line");
        k.set_rules("/images/a", vec![rule(1, "10.0.0.7", Access::Ro, false)])
            .await
            .unwrap();
        assert!(std::fs::read_to_string(&f)
            .unwrap()
            .contains("10.0.0.7(ro,"));
        // ensure_export again keeps the rules.
        k.ensure_export("/images/a", Path::new("/srv/a2"))
            .await
            .unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("\"/srv/a2\" 10.0.0.7(ro,"), "{text}");
        k.set_rules("/images/a", vec![]).await.unwrap();
        assert!(!f.exists());
        k.remove_export("/images/a").await.unwrap();
        k.remove_export("/images/a").await.unwrap();
        assert!(matches!(
            k.set_rules("/images/a", vec![]).await,
            Err(NfsError::UnknownExport(_))
        ));
        assert_eq!(
            std::fs::read_dir(dir.path().join("exports.d"))
                .unwrap()
                .count(),
            0
        );
        let failing = Knfsd::new(KnfsdConfig {
            exports_dir: dir.path().join("e2"),
            exportfs_bin: "false".into(),
        });
        let err = failing
            .ensure_export("/images/a", Path::new("/srv/a"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("false -r failed"), "{err}");
    }
}
