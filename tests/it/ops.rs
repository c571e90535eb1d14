//! The operator's side of a running appliance (issue 23, item 4), against the real
//! binary: SIGHUP reloads (a changed Ignition template, the log filter) without
//! stopping the process or dropping a keep-alive connection; `check-config` and
//! `serve` refuse reversed or overlapping DHCP ranges and bad log filters, naming the
//! key; provisioning jobs are listable (API and `bootplane get jobs`); `/metrics` has a
//! family per subsystem; the log has no colour codes when stderr is not a terminal.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::bootplane::{bin, Bootplane};

/// Wait until the log has `needle` (panics with the log after 20 s).
fn wait_log(b: &Bootplane, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = b.log();
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sighup(b: &Bootplane) {
    let pid = b.child.as_ref().expect("running").id() as i32;
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
}

/// One HTTP/1.1 GET on a kept-alive connection; returns the status line and body.
fn get_on(conn: &mut BufReader<TcpStream>, path: &str) -> (String, String) {
    write!(
        conn.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: boot\r\nConnection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let mut status = String::new();
    conn.read_line(&mut status).unwrap();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        conn.read_line(&mut h).unwrap();
        if h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
            assert!(
                !(k.eq_ignore_ascii_case("connection") && v.trim() == "close"),
                "the server closes the connection: {h}"
            );
        }
    }
    let mut body = vec![0; len];
    conn.read_exact(&mut body).unwrap();
    (
        status.trim().to_string(),
        String::from_utf8_lossy(&body).into(),
    )
}

#[test]
fn sighup_reloads_templates_and_log_filter_without_dropping_a_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let templates = tmp.path().join("ignition");
    std::fs::create_dir_all(&templates).unwrap();
    let tpl = |name: &str, user: &str| {
        std::fs::write(
            templates.join(name),
            format!("variant: fcos\nversion: 1.5.0\npasswd:\n  users:\n    - name: {user}\n"),
        )
        .unwrap()
    };
    tpl("default.bu", "core");
    let cfg = tmp.path().join("bootplane.toml");
    std::fs::write(&cfg, "[log]\nfilter = \"info\"\n").unwrap();
    let set = format!(
        "boot.ignition_templates={:?}",
        templates.display().to_string()
    );
    let cfg_arg = cfg.display().to_string();
    let mut b = Bootplane::start_in(&state, &["--config", &cfg_arg, "--set", &set]);

    // A keep-alive connection to the boot listener, used before and after the reload.
    let sock = TcpStream::connect(("127.0.0.1", b.http_port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = BufReader::new(sock);
    let (status, _) = get_on(&mut conn, "/boot.ipxe");
    assert!(status.ends_with("200 OK"), "{status}");

    // A second template and another log filter, then SIGHUP.
    tpl("worker.bu", "worker");
    std::fs::write(&cfg, "[log]\nfilter = \"info,bootplane=debug\"\n").unwrap();
    sighup(&b);
    let log = wait_log(&b, "SIGHUP: reloaded");
    let line = log
        .lines()
        .find(|l| l.contains("SIGHUP: reloaded"))
        .unwrap();
    assert!(line.contains("templates=2 loaded"), "{line}");
    assert!(line.contains("bootplane=debug"), "{line}");
    // RUST_LOG (set by the test harness) is not the config: only log.filter changed.
    assert!(
        !log.contains("take effect only at restart"),
        "only log.filter changed:\n{log}"
    );

    // The same connection still serves, and the process is alive and ready.
    let (status, _) = get_on(&mut conn, "/boot.ipxe");
    assert!(status.ends_with("200 OK"), "{status}");
    assert!(b.child.as_mut().unwrap().try_wait().unwrap().is_none());
    let (code, _, err) = b.cli(&["get", "servers"]);
    assert_eq!(code, 0, "{err}");

    // A template that no longer compiles keeps the previous ones; still alive.
    std::fs::write(templates.join("broken.yaml"), "ignition: {{ nope").unwrap();
    sighup(&b);
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.log().matches("SIGHUP: reloaded").count() < 2 {
        assert!(Instant::now() < deadline, "{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = b.log();
    let second = log
        .lines()
        .filter(|l| l.contains("SIGHUP: reloaded"))
        .nth(1)
        .unwrap();
    assert!(second.contains("kept the previous ones"), "{second}");
    assert!(b.child.as_mut().unwrap().try_wait().unwrap().is_none());
    let (status, _) = get_on(&mut conn, "/boot.ipxe");
    assert!(status.ends_with("200 OK"), "{status}");

    // A changed key that needs a restart is named.
    std::fs::write(
        &cfg,
        "[log]\nfilter = \"info,bootplane=debug\"\n[http]\nidle_timeout_ms = 1234\n",
    )
    .unwrap();
    sighup(&b);
    wait_log(&b, "take effect only at restart");
    assert!(b.log().contains("http.idle_timeout_ms"), "{}", b.log());
    assert!(b.stop().success());
    // Not a terminal: no ANSI escape in the log.
    assert!(!b.log().contains('\u{1b}'), "colour codes in the log file");
}

fn check_config(toml: &str, extra: &[&str]) -> (bool, String) {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("c.toml");
    std::fs::write(&f, toml).unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&f)
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_never_prints_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("c.toml");
    std::fs::write(
        &f,
        "[api]\ntoken = \"0123456789abcdef0123\"\n[nfs.ontap]\npassword = \"hunter2-ontap-pw\"\n",
    )
    .unwrap();
    let run = |extra: &[&str], file: &Path| {
        Command::new(bin())
            .args(["check-config", "--config"])
            .arg(file)
            .args(extra)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let out = run(&[], &f);
    assert!(out.status.success(), "{out:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in ["0123456789abcdef0123", "hunter2-ontap-pw"] {
        assert!(!all.contains(secret), "{secret} printed: {all}");
    }
    assert_eq!(all.matches("<redacted>").count(), 2, "{all}");
    // Saved as a config file, the output is refused, naming the placeholder's key.
    let saved = tmp.path().join("saved.toml");
    std::fs::write(&saved, &out.stdout).unwrap();
    let again = run(&[], &saved);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("api.token") && err.contains("<redacted>"),
        "{err}"
    );
    // --quiet (the systemd unit's ExecStartPre): nothing but the verdict.
    let quiet = run(&["--quiet"], &f);
    assert!(quiet.status.success());
    assert!(quiet.stdout.is_empty(), "{quiet:?}");
    assert_eq!(String::from_utf8_lossy(&quiet.stderr).trim(), "config ok");
}

#[test]
fn check_config_refuses_bad_ranges_and_log_filters_naming_the_key() {
    let (ok, err) = check_config("[dhcp]\nrange = \"10.0.0.9-10.0.0.1\"\n", &[]);
    assert!(!ok);
    assert!(
        err.contains("dhcp.range") && err.contains("ends before it starts"),
        "{err}"
    );

    let overlap = "[[dhcp.subnets]]\nnetwork = \"10.1.0.0/24\"\nranges = [\"10.1.0.10-10.1.0.50\", \"10.1.0.40-10.1.0.60\"]\n";
    let (ok, err) = check_config(overlap, &[]);
    assert!(!ok);
    assert!(
        err.contains("dhcp.subnets[0].ranges") && err.contains("overlaps"),
        "{err}"
    );

    let (ok, err) = check_config("[discovery.dhcp]\nrange = \"10.2.0.20-10.2.0.2\"\n", &[]);
    assert!(!ok);
    assert!(err.contains("discovery.dhcp.range"), "{err}");

    for bad in ["bootplane=loud", "verbose"] {
        let (ok, err) = check_config("", &["--log-filter", bad]);
        assert!(!ok, "{bad}");
        assert!(err.contains("log.filter"), "{bad}: {err}");
        let (ok, err) = check_config(&format!("[log]\nfilter = {bad:?}\n"), &[]);
        assert!(!ok && err.contains("log.filter"), "{bad}: {err}");
    }

    let good =
        "[dhcp]\nrange = \"10.0.0.100-10.0.0.200\"\n[log]\nfilter = \"info,bootplane=debug\"\n";
    let (ok, err) = check_config(good, &[]);
    assert!(ok, "{err}");

    // `serve` refuses the same before it binds or writes anything.
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["serve", "--log-filter", "bootplane=loud", "--state-dir"])
        .arg(tmp.path().join("state"))
        .args([
            "--api-listen",
            "127.0.0.1:1",
            "--http-listen",
            "127.0.0.1:2",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("log.filter"), "{err}");
    assert!(!tmp.path().join("state").exists());
}

#[test]
fn jobs_are_listable_and_metrics_cover_every_subsystem() {
    let tftp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let tftp_port = tftp.local_addr().unwrap().port();
    drop(tftp);
    let tmp = tempfile::tempdir().unwrap();
    let listen = format!("tftp.listen=\"127.0.0.1:{tftp_port}\"");
    let root = format!("tftp.root={:?}", tmp.path().display().to_string());
    let target_dir = format!(
        "provision.jobs.target_dir={:?}",
        tmp.path().display().to_string()
    );
    let b = Bootplane::start(&[
        "--set",
        "tftp.enabled=true",
        "--set",
        &listen,
        "--set",
        &root,
        "--set",
        &target_dir,
        "--set",
        "provision.jobs.sources=[\"http://127.0.0.1:9/images\"]",
    ]);
    let jobs = format!("{}/apis/bootplane.dev/v1alpha1/jobs", b.api);
    let auth = format!("Bearer {}", b.token);

    let empty: Value = b
        .agent
        .get(&jobs)
        .set("Authorization", &auth)
        .call()
        .unwrap()
        .into_string()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(empty["kind"], "JobList", "{empty}");
    assert_eq!(empty["items"], json!([]));
    let (code, _, err) = b.cli(&["get", "jobs"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("No jobs found"), "{err}");

    let target = tmp.path().join("disk.img");
    let req = json!({
        "server": "s1",
        "source": "http://127.0.0.1:9/images/missing.img",
        "sha256": "ab".repeat(32),
        "target": target.display().to_string(),
    });
    let r = b
        .agent
        .post(&jobs)
        .set("Authorization", &auth)
        .set("Content-Type", "application/json")
        .send_string(&req.to_string())
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.into_string().unwrap().parse().unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    let list: Value = b
        .agent
        .get(&jobs)
        .set("Authorization", &auth)
        .call()
        .unwrap()
        .into_string()
        .unwrap()
        .parse()
        .unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["id"], id.as_str());
    assert_eq!(items[0]["server"], "s1");

    let (code, out, err) = b.cli(&["get", "jobs"]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&head[..3], ["ID", "SERVER", "STATE"], "{out}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], [id.as_str(), "s1"], "{out}");
    let (code, out, err) = b.cli(&["get", "job", &id, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["id"],
        id.as_str()
    );

    // A claim makes the controllers reconcile and power a server (store writes too).
    let (code, _, err) = b.cli_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: m1}\n\
             spec: {systemUUID: 4c4c4544-0001-0001-0001-000000000009}\n\
             status: {state: Available, powerState: \"Off\"}\n---\n\
             apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: c1}\n\
             spec: {power: \"On\", image: os-image:latest, serverRef: {name: m1}}\n",
        ),
    );
    assert_eq!(code, 0, "{err}");
    let metrics = format!("{}/metrics", b.api);
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = b
            .agent
            .get(&metrics)
            .set("Authorization", &auth)
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        if text.contains("bootplane_power_requests_total{") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no power request counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for family in [
        "bootplane_dhcp_",
        "bootplane_tftp_",
        "bootplane_http_",
        "bootplane_api_",
        "bootplane_store_txns_total{result=\"ok\"}",
        "bootplane_store_revision",
        "bootplane_controller_reconciles_total{controller=",
        "bootplane_controller_reconcile_duration_seconds",
        "bootplane_provision_jobs_started_total{runner=\"local\"}",
        "bootplane_power_requests_total{driver=\"test\",action=\"on\",outcome=\"done\"}",
    ] {
        assert!(text.contains(family), "no {family} in /metrics:\n{text}");
    }
    // The metrics role's token reaches /metrics and nothing else.
    let (code, out, err) = b.cli(&["token", "create", "scraper", "--role", "metrics"]);
    assert_eq!(code, 0, "{err}");
    let token = out.split_whitespace().last().unwrap_or("").to_string();
    let r = b
        .agent
        .get(&metrics)
        .set("Authorization", &format!("Bearer {token}"))
        .call();
    assert!(r.is_ok(), "metrics token refused: {r:?} ({out})");
    let denied = b
        .agent
        .get(&jobs)
        .set("Authorization", &format!("Bearer {token}"))
        .call();
    assert!(
        matches!(denied, Err(ureq::Error::Status(403, _))),
        "{denied:?}"
    );
    assert!(!b.log().contains('\u{1b}'), "colour codes in the log file");
}

#[test]
fn release_profile_has_no_debug_info_and_license_matches() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let release = &cargo["profile"]["release"];
    let debug = release.get("debug");
    assert!(
        matches!(
            debug,
            None | Some(toml::Value::Boolean(false)) | Some(toml::Value::Integer(0))
        ),
        "[profile.release] debug = {debug:?}"
    );
    assert_eq!(cargo["package"]["license"].as_str(), Some("Apache-2.0"));
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    assert!(license.contains("Apache License") && license.contains("Version 2.0, January 2004"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
}
