//! `bootplane render ignition`: the binary prints validated Ignition JSON for Butane,
//! for a template + facts + secret, and exits non-zero with a located error otherwise.

use std::path::Path;
use std::process::{Command, Output};

use crate::support;
use support::bootplane::bin;
use support::process::run_cmd;

/// Run the binary from the repository root (fixture paths are relative to it).
fn bootplane(args: &[&str]) -> Output {
    run_cmd(
        Command::new(bin())
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR")),
        30,
    )
}

#[test]
fn render_butane_file_prints_ignition() {
    let o = bootplane(&[
        "render",
        "ignition",
        "--butane",
        "tests/fixtures/butane/trees-1_4.bu",
        "--files-dir",
        "tests/fixtures/butane/files",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/butane/trees-1_4.ign.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(got, want);
}

#[test]
fn render_template_with_facts_and_sample_secret() {
    let dir = tempfile::tempdir().unwrap();
    let facts = dir.path().join("facts.yaml");
    std::fs::write(&facts, "name: server-x\nhostname: host-x\nuuid: 1a2b\nmacs: [\"52:54:00:00:00:01\"]\nips: [127.0.0.1]\nlabels: {rack: r2}\nclaim_name: c\nclaim_namespace: ns\n").unwrap();
    let o = bootplane(&[
        "render",
        "ignition",
        "--template",
        "ignition/default.bu",
        "--facts",
        facts.to_str().unwrap(),
        "--secret",
        "tests/fixtures/ignition_secret.yaml",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ignition"]["version"], "3.3.0");
    assert_eq!(
        v["storage"]["files"][0]["contents"]["source"],
        "data:,host-x%0A"
    );
    assert_eq!(v["systemd"]["units"].as_array().unwrap().len(), 3);
    assert_eq!(v["passwd"]["users"][0]["name"], "metal");
}

#[test]
fn render_errors_are_located_and_exit_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.bu");
    std::fs::write(
        &bad,
        "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: relative/x\n",
    )
    .unwrap();
    let o = bootplane(&["render", "ignition", "--butane", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "storage.files[0].path (line 5, column 7): path \"relative/x\" must be absolute"
        ),
        "{err}"
    );
    // `--server` asks a running bootplane; none listens on port 1 of loopback.
    let o = bootplane(&[
        "render",
        "ignition",
        "--server",
        "server-a",
        "--api",
        "http://127.0.0.1:1",
        "--token",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("connecting to http://127.0.0.1:1"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
