//! The CLI's client config (`bootplane config …`, kubeconfig-like): contexts built with
//! the `config` commands, then `bootplane get servers` with no connection flags at all, a
//! context switch changing the target, bad files and names refused with clear errors, and
//! tokens never printed by `config view`.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::bootplane::{bin, Bootplane};

/// Run `bootplane ARGS` with only `env` (no --server, --token or --state-dir), from
/// an empty working dir so the default `./var/bootplane` state dir holds nothing.
fn run(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(cwd)
        .env_remove("BOOTPLANE_SERVER")
        .env_remove("BOOTPLANE_TOKEN")
        .env_remove("BOOTPLANE_STATE_DIR")
        .env_remove("BOOTPLANE_CONTEXT")
        .env_remove("BOOTPLANE_CLIENT_CONFIG")
        .env("HOME", cwd)
        .env_remove("XDG_CONFIG_HOME")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(r: (i32, String, String)) -> String {
    assert_eq!(r.0, 0, "stdout: {}\nstderr: {}", r.1, r.2);
    r.1
}

fn fails(r: (i32, String, String), want: &str) -> String {
    assert_ne!(r.0, 0, "expected a failure; stdout: {}", r.1);
    assert!(r.2.contains(want), "stderr lacks {want:?}: {}", r.2);
    r.2
}

#[test]
fn contexts_from_the_config_commands_reach_the_api_with_no_flags() {
    let b = Bootplane::start(&[]);
    let (code, _, err) = b.cli_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: ctx-server-1}\n\
             spec: {systemUUID: 8a3c1d2e-0000-4000-8000-000000000001}\n",
        ),
    );
    assert_eq!(code, 0, "{err}");

    let home = tempfile::tempdir().unwrap();
    let cwd = home.path();
    let token_file = cwd.join("admin-token");
    std::fs::write(&token_file, format!("{}\n", b.token)).unwrap();
    let ca = b.dir.join("tls/ca.crt");
    let api = b.api.as_str();

    // Build two contexts: `lab` (right token) and `stale` (a wrong one), on one cluster.
    let mut cluster = vec!["config", "set-cluster", "lab", "--server", api];
    let ca_s = ca.to_string_lossy().into_owned();
    if ca.exists() {
        cluster.extend(["--certificate-authority", &ca_s]);
    }
    ok(run(cwd, &[], &cluster));
    let tf = token_file.to_string_lossy().into_owned();
    ok(run(
        cwd,
        &[],
        &["config", "set-credentials", "admin", "--token-file", &tf],
    ));
    ok(run(
        cwd,
        &[],
        &[
            "config",
            "set-credentials",
            "stale",
            "--token",
            "not-the-token-0123456789",
        ],
    ));
    ok(run(
        cwd,
        &[],
        &[
            "config",
            "set-context",
            "lab",
            "--cluster",
            "lab",
            "--user",
            "admin",
        ],
    ));
    ok(run(
        cwd,
        &[],
        &[
            "config",
            "set-context",
            "stale",
            "--cluster",
            "lab",
            "--user",
            "stale",
        ],
    ));
    let file = cwd.join(".config/bootplane/config");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600,
        "the client config holds tokens"
    );

    // No current context yet and nothing in ./var/bootplane: a clear error.
    fails(run(cwd, &[], &["get", "servers"]), "no credentials");

    let out = ok(run(cwd, &[], &["config", "use-context", "lab"]));
    assert!(out.contains("Switched to context \"lab\""), "{out}");
    assert_eq!(
        ok(run(cwd, &[], &["config", "current-context"])).trim(),
        "lab"
    );
    let ctxs = ok(run(cwd, &[], &["config", "get-contexts"]));
    let lab = ctxs
        .lines()
        .find(|l| l.contains(" lab "))
        .unwrap_or_default();
    assert!(lab.starts_with('*'), "{ctxs}");
    assert!(lab.contains(api), "{ctxs}");

    // The point: `get servers` with no flags, from a laptop-like empty directory.
    let out = ok(run(cwd, &[], &["get", "servers"]));
    assert!(out.contains("ctx-server-1"), "{out}");

    // --context picks another for one command; the stale token is refused by the API.
    fails(
        run(cwd, &[], &["get", "servers", "--context", "stale"]),
        "Unauthorized",
    );
    // A flag still wins over the context.
    let out = ok(run(
        cwd,
        &[],
        &["get", "servers", "--context", "stale", "--token", &b.token],
    ));
    assert!(out.contains("ctx-server-1"), "{out}");

    // The file can live elsewhere (env), and `view` never prints a token.
    let moved = cwd.join("elsewhere.yaml");
    std::fs::copy(&file, &moved).unwrap();
    std::fs::remove_file(&file).unwrap();
    let env = [("BOOTPLANE_CLIENT_CONFIG", moved.as_path())];
    let out = ok(run(cwd, &env, &["get", "servers"]));
    assert!(out.contains("ctx-server-1"), "{out}");
    let view = ok(run(cwd, &env, &["config", "view"]));
    assert!(!view.contains("not-the-token"), "{view}");
    assert!(view.contains("REDACTED"), "{view}");
    let raw = ok(run(cwd, &env, &["config", "view", "--raw"]));
    assert!(raw.contains("not-the-token"), "{raw}");
}

#[test]
fn bad_client_configs_and_names_are_refused_clearly() {
    let home = tempfile::tempdir().unwrap();
    let cwd = home.path();
    // Unknown context.
    fails(
        run(cwd, &[], &["config", "use-context", "nope"]),
        "no context exists with the name \"nope\"",
    );
    // An explicitly named file that is missing.
    let missing = cwd.join("missing.yaml");
    fails(
        run(
            cwd,
            &[("BOOTPLANE_CLIENT_CONFIG", &missing)],
            &["get", "servers"],
        ),
        "missing.yaml",
    );
    // A typo in a field: the file and the field are named; the file is left as it was.
    let bad = cwd.join("bad.yaml");
    let text = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {tokn: x}\n";
    std::fs::write(&bad, text).unwrap();
    let err = fails(
        run(
            cwd,
            &[("BOOTPLANE_CLIENT_CONFIG", &bad)],
            &[
                "config",
                "set-context",
                "c",
                "--cluster",
                "a",
                "--user",
                "u",
            ],
        ),
        "unknown field `tokn`",
    );
    assert!(err.contains("bad.yaml"), "{err}");
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), text, "nothing lost");
    // A context naming what does not exist.
    let env = [("BOOTPLANE_CLIENT_CONFIG", cwd.join("c.yaml"))];
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    fails(
        run(
            cwd,
            &env,
            &[
                "config",
                "set-context",
                "c",
                "--cluster",
                "none",
                "--user",
                "none",
            ],
        ),
        "names cluster \"none\"",
    );
    // A server that is not a URL; a certificate without its key.
    fails(
        run(
            cwd,
            &env,
            &["config", "set-cluster", "x", "--server", "10.0.0.1:9090"],
        ),
        "must start with https://",
    );
    fails(
        run(
            cwd,
            &env,
            &[
                "config",
                "set-credentials",
                "u",
                "--client-certificate",
                "/x.crt",
            ],
        ),
        "--client-key",
    );
    // A deeply nested file is refused before it is built.
    let deep = cwd.join("deep.yaml");
    std::fs::write(&deep, format!("{}1{}", "[".repeat(200), "]".repeat(200))).unwrap();
    fails(
        run(
            cwd,
            &[("BOOTPLANE_CLIENT_CONFIG", &deep)],
            &["config", "view"],
        ),
        "deep.yaml",
    );
}
