//! Packaging (issue 23, item 5): shell completion generated from the CLI loads in bash
//! and completes resource types, the man pages render, the systemd unit in the repo
//! passes `systemd-analyze verify`.

use crate::support;

use std::path::Path;
use std::process::Command;

use support::bootplane::bin;

fn run(args: &[&str]) -> String {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "bootplane {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Complete `line` (the cursor at its end) with the completion script `script` loaded
/// in a non-interactive bash, the way readline calls the function `complete -p` names.
fn bash_complete(script: &Path, line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split(' ').collect();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        r#"set -e
source '{script}'
spec=$(complete -p bootplane)
func=$(sed -E 's/.*-F ([^ ]+).*/\1/' <<<"$spec")
COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE='{line}'
COMP_POINT=${{#COMP_LINE}}
COMP_TYPE=9
"$func" bootplane '{cur}' '{prev}'
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        script = script.display(),
        words = quoted.join(" "),
        cword = words.len() - 1,
        cur = words[words.len() - 1],
        prev = words[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &prog])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completion_loads_and_completes_resource_types() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("bootplane.bash");
    std::fs::write(&script, run(&["completion", "bash"])).unwrap();

    let got = bash_complete(&script, "bootplane get serv");
    assert!(got.iter().any(|w| w == "servers"), "get serv<TAB>: {got:?}");
    assert!(
        got.iter().any(|w| w == "serverclaims"),
        "get serv<TAB>: {got:?}"
    );
    assert!(
        got.iter().all(|w| w.starts_with("serv")),
        "get serv<TAB>: {got:?}"
    );

    let got = bash_complete(&script, "bootplane che");
    assert_eq!(got, ["check-config"], "che<TAB>");
    let got = bash_complete(&script, "bootplane delete serverc");
    assert!(
        got.iter().any(|w| w == "serverclaims"),
        "delete serverc<TAB>: {got:?}"
    );

    // The parser still takes what completion does not offer (comma lists): the
    // command gets as far as connecting.
    let out = Command::new(bin())
        .args([
            "get",
            "servers,serverclaims",
            "--server",
            "https://127.0.0.1:1",
        ])
        .env("BOOTPLANE_CLIENT_CONFIG", "/dev/null")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("invalid value"), "{err}");
}

#[test]
fn zsh_and_fish_completion_and_man_pages() {
    let zsh = run(&["completion", "zsh"]);
    assert!(
        zsh.starts_with("#compdef bootplane"),
        "{}",
        &zsh[..zsh.len().min(200)]
    );
    assert!(zsh.contains("check-config"));
    let fish = run(&["completion", "fish"]);
    assert!(fish.contains("complete -c bootplane"), "{fish}");
    // clap_complete's fish script completes subcommands and flags, not positionals.
    assert!(fish.contains("-a \"check-config\""), "{fish}");

    let man = run(&["man"]);
    assert!(
        man.contains(".TH bootplane 1"),
        "{}",
        &man[..man.len().min(300)]
    );
    assert!(man.contains("check\\-config") || man.contains("check-config"));
    let tmp = tempfile::tempdir().unwrap();
    run(&["man", "--dir", tmp.path().to_str().unwrap()]);
    for page in [
        "bootplane.1",
        "bootplane-serve.1",
        "bootplane-get.1",
        "bootplane-completion.1",
    ] {
        assert!(tmp.path().join(page).is_file(), "{page} not written");
    }
    // man(1) renders it without warnings.
    let out = Command::new("man")
        .arg("-l")
        .arg(tmp.path().join("bootplane-get.1"))
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_STDERR", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--selector"), "{text}");
}

#[test]
fn systemd_unit_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd/bootplane.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for want in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "StateDirectory=bootplane",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_NET_ADMIN CAP_NET_RAW",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(text.contains(want), "{want} missing from the unit");
    }
    // systemd-analyze checks the unit's syntax and that ExecStart's binary exists: point
    // it at the one this test built.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("bootplane.service");
    std::fs::write(&copy, text.replace("/usr/local/bin/bootplane", bin())).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let err = String::from_utf8_lossy(&out.stderr);
    // Outside a booted systemd (containers, CI) it may say so; the unit's own lines
    // must not be complained about.
    let about_unit: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("bootplane.service"))
        .collect();
    assert!(about_unit.is_empty(), "systemd-analyze verify: {err}");
    assert!(out.status.success(), "systemd-analyze verify: {err}");
}
