//! The Python `kubernetes` client (PyPI, pinned in scripts/test-python.txt, in the test
//! virtualenv) against the real `bootplane serve` over TLS, with `config.load_kube_config`
//! (issue 34): `CustomObjectsApi` create/get/list/patch (merge and JSON)/delete and the
//! Status errors it raises (404, 409, 422), a `Watch()` stream seeing a create, the
//! `DynamicClient`'s discovery, and, across a restart (the watch history is in memory), a
//! watch from a version older than the history raising 410 and a re-list going on.
//! The script is `kube_python.py` beside this file.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::bootplane::Bootplane;
use support::libvirt::VENV;
use support::process::run_for;

fn python(script: &std::path::Path, args: &[&str], home: &std::path::Path) -> String {
    let py = format!("{VENV}/bin/python3");
    support::require::require_file(&py, "python3-venv (scripts/test.sh makes the venv)");
    let out = run_for(
        Command::new(&py)
            .arg(script)
            .args(args)
            .env("HOME", home)
            .env("TMPDIR", home),
        Duration::from_secs(120),
    );
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "kube_python.py {args:?}\nstdout: {so}\nstderr: {se}"
    );
    so
}

#[test]
fn python_client_crud_watch_discovery_and_410() {
    let mut b = Bootplane::start(&[]);
    let home = tempfile::tempdir().unwrap();
    let script = home.path().join("kube_python.py");
    std::fs::write(&script, include_str!("kube_python.py")).unwrap();
    let cfg = home.path().join("kubeconfig");
    support::kube::write_kubeconfig(&cfg, &b.api, &b.dir.join("tls/ca.crt"), &b.token);
    let cfg = cfg.to_str().unwrap();
    let out = python(&script, &["crud", cfg], home.path());
    let rv = out.lines().last().unwrap_or_default().trim().to_string();
    assert!(rv.parse::<u64>().is_ok(), "{out}");
    b.stop();
    b.spawn();
    let out = python(&script, &["gone", cfg, &rv], home.path());
    assert_eq!(out.trim(), "ok");
}
