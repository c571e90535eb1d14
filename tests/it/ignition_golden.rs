//! Golden corpus: every `tests/fixtures/butane/NAME.bu` translates to exactly
//! `NAME.ign.json`, the output passes the embedded JSON schema + semantic rules, and
//! Debian's real `ignition-validate` accepts every output whose version it supports
//! (Debian's ignition 2.14 knows spec 3.0–3.3 stable; 3.4/3.5 are checked by schema).
//!
//! To regenerate the expected files after an intended change:
//! `BOOTPLANE_BLESS=1 cargo test --test ignition_golden` (then review the diff).

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use bootplane::ignition::{self, FilesDir, IgnVersion};
use serde_json::Value;
use support::data::fixtures;
use support::process::run_cmd;
use support::require::require;

fn corpus_dir() -> PathBuf {
    fixtures().join("butane")
}

fn corpus() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bu"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn files_dir() -> FilesDir {
    FilesDir::read_dir(&corpus_dir().join("files")).unwrap()
}

fn keys(v: &Value, p: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let q = if p.is_empty() {
                    k.clone()
                } else {
                    format!("{p}.{k}")
                };
                out.insert(q.clone());
                keys(x, &q, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys(x, p, out)),
        _ => {}
    }
}

#[test]
fn corpus_translates_to_golden_output() {
    let bless = std::env::var_os("BOOTPLANE_BLESS").is_some();
    let files = files_dir();
    let corpus = corpus();
    assert!(
        corpus.len() >= 30,
        "corpus has only {} inputs",
        corpus.len()
    );
    let mut failures = Vec::new();
    for (name, src) in &corpus {
        let out = match ignition::translate_with(src, &files) {
            Ok(t) => t.config,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let path = corpus_dir().join(format!("{name}.ign.json"));
        if bless {
            std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap() + "\n").unwrap();
            continue;
        }
        let want: Value = match std::fs::read_to_string(&path) {
            Ok(s) => serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            Err(e) => {
                failures.push(format!("{name}: missing {}: {e}", path.display()));
                continue;
            }
        };
        if want != out {
            failures.push(format!(
                "{name}: output differs\nwant: {}\n got: {}",
                serde_json::to_string(&want).unwrap(),
                serde_json::to_string(&out).unwrap()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_covers_every_section_and_version() {
    let files = files_dir();
    let mut seen = BTreeSet::new();
    let mut versions = BTreeSet::new();
    let mut variants = BTreeSet::new();
    for (name, src) in corpus() {
        let t = ignition::translate_with(&src, &files).unwrap_or_else(|e| panic!("{name}: {e}"));
        versions.insert(t.version);
        variants.insert(src.lines().next().unwrap_or("").to_string());
        keys(&t.config, "", &mut seen);
    }
    for v in IgnVersion::ALL {
        assert!(versions.contains(&v), "no corpus input for ignition {v}");
    }
    assert!(variants.contains("variant: flatcar"), "no flatcar input");
    let required = [
        "passwd.users.passwordHash",
        "passwd.users.sshAuthorizedKeys",
        "passwd.users.groups",
        "passwd.groups.gid",
        "storage.files.contents.source",
        "storage.files.contents.compression",
        "storage.files.contents.verification.hash",
        "storage.files.contents.httpHeaders",
        "storage.files.append",
        "storage.files.mode",
        "storage.files.user.name",
        "storage.files.group.id",
        "storage.files.overwrite",
        "storage.directories.mode",
        "storage.links.target",
        "storage.links.hard",
        "storage.disks.partitions.sizeMiB",
        "storage.disks.wipeTable",
        "storage.raid.level",
        "storage.filesystems.mountOptions",
        "storage.luks.clevis.tang",
        "storage.luks.keyFile.source",
        "storage.luks.discard",
        "storage.luks.cex",
        "systemd.units.enabled",
        "systemd.units.mask",
        "systemd.units.contents",
        "systemd.units.dropins.contents",
        "kernelArguments.shouldExist",
        "kernelArguments.shouldNotExist",
        "ignition.config.merge",
        "ignition.config.replace",
        "ignition.timeouts.httpTotal",
        "ignition.security.tls.certificateAuthorities",
        "ignition.proxy.httpsProxy",
    ];
    let missing: Vec<_> = required.iter().filter(|k| !seen.contains(**k)).collect();
    assert!(missing.is_empty(), "corpus output never uses {missing:?}");
}

#[test]
fn corpus_outputs_pass_schema_and_real_ignition_validate() {
    require("ignition-validate");
    let files = files_dir();
    let dir = tempfile::tempdir().unwrap();
    let mut checked_by_real = 0;
    for (name, src) in corpus() {
        let t = ignition::translate_with(&src, &files).unwrap_or_else(|e| panic!("{name}: {e}"));
        ignition::validate(&t.config).unwrap_or_else(|e| panic!("{name}: schema/semantic: {e}"));
        if t.version <= IgnVersion::V3_3 {
            let p = dir.path().join(format!("{name}.ign"));
            std::fs::write(&p, serde_json::to_vec(&t.config).unwrap()).unwrap();
            let out = run_cmd(Command::new("ignition-validate").arg(&p), 20);
            assert!(
                out.status.success(),
                "{name}: ignition-validate failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked_by_real += 1;
        }
    }
    assert!(
        checked_by_real >= 15,
        "only {checked_by_real} configs were checked by ignition-validate"
    );
}

#[test]
fn real_ignition_validate_rejects_what_we_reject() {
    require("ignition-validate");
    // The reverse direction: configs our validator rejects are also rejected by the
    // real one, so our errors are not stricter than Ignition on these rules.
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"etc/relative"}]}}"#,
        r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a"}],"directories":[{"path":"/a"}]}}"#,
        r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a","mode":99999}]}}"#,
        r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:;base64,!!"}}]}}"#,
        r#"{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"noextension"}]}}"#,
    ];
    for (i, b) in bad.iter().enumerate() {
        let v: Value = serde_json::from_str(b).unwrap();
        assert!(ignition::validate(&v).is_err(), "we accepted {b}");
        let p = dir.path().join(format!("bad{i}.ign"));
        std::fs::write(&p, b).unwrap();
        let out = run_cmd(Command::new("ignition-validate").arg(&p), 20);
        assert!(!out.status.success(), "ignition-validate accepted {b}");
    }
}

#[test]
fn metal_operator_sample_secret_renders_and_validates() {
    require("ignition-validate");
    let src = std::fs::read_to_string(fixtures().join("ignition_secret.yaml")).unwrap();
    let secret = ignition::IgnitionSecret::from_manifest(&src).unwrap();
    assert_eq!(secret.format.as_deref(), Some("fcos"));
    let r = ignition::Renderer::new();
    let facts = ignition::MachineFacts {
        name: "server-sample".into(),
        ..Default::default()
    };
    let out = r.render(None, &facts, Some(&secret)).unwrap();
    assert_eq!(out.version, IgnVersion::V3_2);
    let units = out.config["systemd"]["units"].as_array().unwrap();
    assert_eq!(units.len(), 3);
    assert_eq!(units[2]["name"], "metalprobe.service");
    assert_eq!(out.config["passwd"]["users"][0]["name"], "metal");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sample.ign");
    std::fs::write(&p, &out.json).unwrap();
    let o = run_cmd(Command::new("ignition-validate").arg(&p), 20);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
