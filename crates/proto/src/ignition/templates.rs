//! The operator's template directory (`boot.ignition_templates`, default `ignition/`)
//! as the boot side uses it: loaded once, re-loaded when a file in it changes (an mtime
//! and size check of the directory, its templates and its `files/` tree, polled by the
//! boot index), and the rule that picks a machine's template.
//!
//! Selection: the label `bootplane.dev/ignition-template` on the ServerClaim, else on
//! the Server, names the template (file name, with or without its extension; `none` =
//! no template). Without the label, `default` (`default.bu`, `default.yaml`,
//! `default.yml`, `default.ign` or `default.json`, first found) applies when present,
//! else no template (the claim's secret alone is served). A label that names a
//! missing template is an error for the boot configuration, not a silent fallback.
//!
//! File reads happen here (the edge); rendering ([`super::render`]) stays pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::render::{Renderer, Template};

/// Label (on a ServerClaim or a Server) that names the Ignition template to use.
pub(crate) const TEMPLATE_LABEL: &str = "bootplane.dev/ignition-template";
/// Server label giving the machine's hostname (`hostname` variable; default: the name).
pub const HOSTNAME_LABEL: &str = "bootplane.dev/hostname";
/// Template extensions, in the order a bare name (`default`) is resolved.
pub(crate) const EXTENSIONS: [&str; 5] = [".bu", ".yaml", ".yml", ".ign", ".json"];

/// What identifies one state of the directory on disk.
type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// Loaded templates plus the stamp of the files they came from.
pub struct TemplateSet {
    pub renderer: Renderer,
    pub dir: PathBuf,
    stamp: Stamp,
    /// Content hash of `files/` folded into every template revision, so a changed
    /// local file also changes the cache key.
    files_revision: String,
}

/// Why no template could be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectError {
    pub label_value: String,
    pub message: String,
}

impl TemplateSet {
    /// No templates (the directory does not exist).
    pub fn empty(dir: &Path) -> TemplateSet {
        TemplateSet {
            renderer: Renderer::new(),
            dir: dir.to_path_buf(),
            stamp: Vec::new(),
            files_revision: String::new(),
        }
    }

    /// Loads `dir` (a missing directory is an empty set; a template that does not
    /// compile is an error naming the file and line).
    pub fn load(dir: &Path) -> anyhow::Result<TemplateSet> {
        let stamp = stamp(dir);
        if !dir.is_dir() {
            let mut s = TemplateSet::empty(dir);
            s.stamp = stamp;
            return Ok(s);
        }
        let renderer = Renderer::load_dir(dir)?;
        let files_revision = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            for (rel, e) in renderer.files().under("") {
                h.update(rel.as_bytes());
                h.update(format!("{e:?}").as_bytes());
            }
            if renderer.files().is_empty() {
                String::new()
            } else {
                hex::encode(&h.finalize()[..6])
            }
        };
        Ok(TemplateSet {
            renderer,
            dir: dir.to_path_buf(),
            stamp,
            files_revision,
        })
    }

    /// How many templates the set holds.
    pub fn len(&self) -> usize {
        self.renderer.template_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when something in the directory changed since it was loaded.
    pub fn changed_on_disk(&self) -> bool {
        stamp(&self.dir) != self.stamp
    }

    /// The template for a machine: by [`TEMPLATE_LABEL`] on the claim, else on the
    /// server, else `default.*` if present, else none.
    pub fn select(
        &self,
        claim_labels: &BTreeMap<String, String>,
        server_labels: &BTreeMap<String, String>,
    ) -> Result<Option<&Template>, SelectError> {
        let wanted = claim_labels
            .get(TEMPLATE_LABEL)
            .or_else(|| server_labels.get(TEMPLATE_LABEL));
        match wanted.map(String::as_str) {
            Some("none") => Ok(None),
            Some(v) => self.find(v).map(Some).ok_or_else(|| SelectError {
                label_value: v.to_string(),
                message: format!(
                    "ignition template {v:?} (label {TEMPLATE_LABEL}) not found in {}",
                    self.dir.display()
                ),
            }),
            None => Ok(self.find("default")),
        }
    }

    /// A template by file name, or by name without extension.
    pub(crate) fn find(&self, name: &str) -> Option<&Template> {
        if let Some(t) = self.renderer.template(name) {
            return Some(t);
        }
        EXTENSIONS
            .iter()
            .find_map(|e| self.renderer.template(&format!("{name}{e}")))
    }

    /// The cache-key revision of a template: its content hash plus the `files/` hash.
    pub fn revision(&self, t: &Template) -> String {
        if self.files_revision.is_empty() {
            t.revision.clone()
        } else {
            format!("{}+{}", t.revision, self.files_revision)
        }
    }
}

/// (path, size, mtime) of the directory, every file in it and everything under `files/`.
fn stamp(dir: &Path) -> Stamp {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(md) = std::fs::metadata(&d) else {
            continue;
        };
        out.push((d.clone(), md.len(), md.modified().ok()));
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if md.is_dir() {
                // Only `files/` is read by the loader; other subdirectories do not matter.
                if d != dir || e.file_name() == "files" {
                    stack.push(p);
                }
            } else {
                out.push((p, md.len(), md.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selection_rule_and_change_detection() {
        let dir = tempfile::tempdir().unwrap();
        let set = TemplateSet::load(&dir.path().join("absent")).unwrap();
        assert!(set.select(&labels(&[]), &labels(&[])).unwrap().is_none());

        let bu = "variant: fcos\nversion: 1.4.0\n";
        std::fs::write(dir.path().join("default.bu"), bu).unwrap();
        std::fs::write(dir.path().join("worker.yaml"), bu).unwrap();
        let set = TemplateSet::load(dir.path()).unwrap();
        assert!(!set.changed_on_disk());
        let pick = |c: &[(&str, &str)], s: &[(&str, &str)]| {
            set.select(&labels(c), &labels(s))
                .map(|t| t.map(|t| t.name.clone()))
        };
        assert_eq!(pick(&[], &[]).unwrap().as_deref(), Some("default.bu"));
        assert_eq!(
            pick(&[], &[(TEMPLATE_LABEL, "worker")]).unwrap().as_deref(),
            Some("worker.yaml")
        );
        // The claim's label wins over the server's.
        assert_eq!(
            pick(
                &[(TEMPLATE_LABEL, "default.bu")],
                &[(TEMPLATE_LABEL, "worker")]
            )
            .unwrap()
            .as_deref(),
            Some("default.bu")
        );
        assert_eq!(pick(&[(TEMPLATE_LABEL, "none")], &[]).unwrap(), None);
        let e = pick(&[], &[(TEMPLATE_LABEL, "gpu")]).unwrap_err();
        assert!(e.message.contains("\"gpu\""), "{e:?}");

        std::fs::create_dir(dir.path().join("files")).unwrap();
        assert!(set.changed_on_disk());
        let set = TemplateSet::load(dir.path()).unwrap();
        let rev0 = set.revision(set.find("default").unwrap());
        std::fs::write(dir.path().join("files/motd"), "hi").unwrap();
        assert!(set.changed_on_disk());
        let set = TemplateSet::load(dir.path()).unwrap();
        assert_ne!(set.revision(set.find("default").unwrap()), rev0);
        // Editing a template is seen (size and mtime are both in the stamp).
        std::fs::write(dir.path().join("default.bu"), format!("{bu}# more\n")).unwrap();
        assert!(set.changed_on_disk());
    }
}
