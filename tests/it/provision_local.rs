//! Local job runner against real child processes: a fake provisioner script (until
//! `bootplane provision` streams images) that emits JSON progress on stderr and exits
//! 0 / non-zero / gets killed / hangs; plus the real `bootplane provision` CLI for the
//! argument contract, and the REST router on 127.0.0.1.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::provision::local::{LocalConfig, LocalRunner, RetryPolicy};
use bootplane::provision::{JobRunner, JobState, JobStatus, ProvisionRequest};

/// The fake provisioner. Behaviour per attempt comes from `$DIR/mode` (one word per
/// attempt line: ok, fail, selfkill, hang, wait); it records its arguments and pid.
const SCRIPT: &str = r#"#!/bin/sh
dir="$(dirname "$0")"
echo "$@" > "$dir/args"
echo $$ > "$dir/pid"
n=$(cat "$dir/attempts" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$dir/attempts"
mode=$(sed -n "${n}p" "$dir/mode"); [ -n "$mode" ] || mode=$(tail -n1 "$dir/mode")
echo "opening source" >&2
echo '{"stage":"read","bytes":0,"total":4096,"rate":0,"eta":null,"frame":0}' >&2
echo '{"stage":"write","bytes":2048,"total":4096,"rate":1048576.0}' >&2
case "$mode" in
  ok) echo '{"stage":"done","bytes":4096,"total":4096,"rate":2097152}' >&2; exit 0 ;;
  fail) echo '{"stage":"error","error":"sha256 mismatch: expected aa, got bb"}' >&2; exit 3 ;;
  selfkill) kill -9 $$ ;;
  hang) sleep 30 & echo $! > "$dir/grandchild"; wait ;;
  wait) while [ ! -e "$dir/go" ]; do sleep 0.05; done; exit 0 ;;
esac
"#;

struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new(modes: &[&str]) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fake-provision.sh"), SCRIPT).unwrap();
        std::fs::write(dir.path().join("mode"), modes.join("\n") + "\n").unwrap();
        Fake { dir }
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    fn runner(&self, timeout_secs: u64, retry: RetryPolicy) -> LocalRunner {
        LocalRunner::new(LocalConfig {
            command: vec![
                "sh".into(),
                self.path("fake-provision.sh").display().to_string(),
            ],
            timeout_secs,
            max_concurrent: 2,
            max_jobs: 100,
            retry,
        })
        .unwrap()
    }
}

fn request(id: Option<&str>) -> ProvisionRequest {
    serde_json::from_value(serde_json::json!({
        "id": id,
        "server": "s390-01",
        "image": "ubuntu",
        "nfs": {"server": "127.0.0.1", "export": "/srv/images/ubuntu", "path": "ubuntu.img.zst"},
        "sha256": "ab".repeat(32),
        "target": "/tmp/bootplane-test-disk.img"
    }))
    .unwrap()
}

fn no_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 0,
        ..Default::default()
    }
}

async fn wait_done(r: &dyn JobRunner, id: &str, limit: Duration) -> JobStatus {
    let start = Instant::now();
    loop {
        let s = r.status(id).await.unwrap();
        if s.state.is_finished() {
            return s;
        }
        assert!(
            start.elapsed() < limit,
            "job {id} not finished after {limit:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: i32) -> bool {
    // Zombies count as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test]
async fn success_reports_progress_and_passes_arguments() {
    let f = Fake::new(&["ok"]);
    let r = f.runner(20, no_retry());
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!(s.state, JobState::Succeeded, "{s:?}");
    assert_eq!(s.progress.bytes, 4096);
    assert_eq!(s.progress.total, Some(4096));
    assert_eq!(s.progress.rate, Some(2097152.0));
    assert_eq!(s.progress.stage.as_deref(), Some("done"));
    assert_eq!(s.attempts, 1);
    assert!(s.started_at.is_some() && s.finished_at.is_some());
    let args = std::fs::read_to_string(f.path("args")).unwrap();
    assert_eq!(
        args.trim(),
        format!("--source nfs://127.0.0.1/srv/images/ubuntu/ubuntu.img.zst --target /tmp/bootplane-test-disk.img --sha256 {}", "ab".repeat(32))
    );
}

#[tokio::test]
async fn nonzero_exit_fails_with_reason_and_is_not_retried_by_default() {
    let f = Fake::new(&["fail", "ok"]);
    let r = f.runner(
        20,
        RetryPolicy {
            backoff_ms: 10,
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(
        s.reason.as_deref(),
        Some("exit code 3: sha256 mismatch: expected aa, got bb")
    );
    assert_eq!(s.attempts, 1);
    assert_eq!(
        s.progress.bytes, 2048,
        "last progress before the failure is kept"
    );
}

#[tokio::test]
async fn exit_codes_listed_in_the_policy_are_retried() {
    let f = Fake::new(&["fail", "ok"]);
    let r = f.runner(
        20,
        RetryPolicy {
            max_retries: 1,
            backoff_ms: 10,
            exit_codes: vec![3],
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!(s.state, JobState::Succeeded, "{s:?}");
    assert_eq!(s.attempts, 2);
}

#[tokio::test]
async fn killed_job_is_retried_per_policy_then_fails() {
    // Killed once, then succeeds: retried.
    let f = Fake::new(&["selfkill", "ok"]);
    let r = f.runner(
        20,
        RetryPolicy {
            max_retries: 2,
            backoff_ms: 10,
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!(s.state, JobState::Succeeded, "{s:?}");
    assert_eq!(s.attempts, 2);

    // Killed every time: Failed after 1 + max_retries attempts, with the signal named.
    let f = Fake::new(&["selfkill"]);
    let r = f.runner(
        20,
        RetryPolicy {
            max_retries: 1,
            backoff_ms: 10,
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!(s.state, JobState::Failed);
    let reason = s.reason.unwrap();
    assert!(
        reason.starts_with("killed by SIGKILL (9)") && reason.ends_with("(after 2 attempts)"),
        "{reason}"
    );
    assert_eq!(s.attempts, 2);

    // Policy says no retry on signals: Failed after one attempt.
    let f = Fake::new(&["selfkill", "ok"]);
    let r = f.runner(
        20,
        RetryPolicy {
            max_retries: 3,
            backoff_ms: 10,
            on_signal: false,
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!((s.state, s.attempts), (JobState::Failed, 1), "{s:?}");
}

#[tokio::test]
async fn job_killed_from_outside_is_retried() {
    let f = Fake::new(&["wait"]);
    let r = f.runner(
        20,
        RetryPolicy {
            max_retries: 1,
            backoff_ms: 10,
            ..Default::default()
        },
    );
    let id = r.start(request(None)).await.unwrap();
    // Wait until the child is running, then kill it like an OOM killer would.
    let start = Instant::now();
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(f.path("pid")) {
            if let Ok(p) = p.trim().parse::<i32>() {
                break p;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "child never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.status(&id).await.unwrap().state, JobState::Running);
    std::fs::remove_file(f.path("pid")).unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Second attempt: let it finish.
    let start = Instant::now();
    while !f.path("pid").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no second attempt"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = r.status(&id).await.unwrap();
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .contains("attempt 1 failed: killed by SIGKILL"),
        "{s:?}"
    );
    std::fs::write(f.path("go"), b"").unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(20)).await;
    assert_eq!((s.state, s.attempts), (JobState::Succeeded, 2), "{s:?}");
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let f = Fake::new(&["hang"]);
    let r = f.runner(
        1,
        RetryPolicy {
            max_retries: 0,
            ..Default::default()
        },
    );
    let t0 = Instant::now();
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(15)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "timeout took {:?}",
        t0.elapsed()
    );
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(s.reason.as_deref(), Some("timed out after 1 s"));
    let gc: i32 = std::fs::read_to_string(f.path("grandchild"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !alive(gc),
        "the child's own child (sleep) must be killed too"
    );
}

#[tokio::test]
async fn cancel_and_idempotent_start() {
    let f = Fake::new(&["hang"]);
    let r = f.runner(60, RetryPolicy::default());
    let id = r.start(request(Some("action-1"))).await.unwrap();
    assert_eq!(id, "action-1");
    // Same id again: the same job, no second process.
    assert_eq!(
        r.start(request(Some("action-1"))).await.unwrap(),
        "action-1"
    );
    // Running, with its attempt counted: the script writes `grandchild` after
    // `attempts` (waiting for `pid` raced the cancel against that write).
    let start = Instant::now();
    while !f.path("grandchild").exists() {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.cancel("action-1").await.unwrap();
    let s = r.status("action-1").await.unwrap();
    assert_eq!(
        (s.state, s.reason.as_deref()),
        (JobState::Failed, Some("cancelled"))
    );
    assert_eq!(
        std::fs::read_to_string(f.path("attempts")).unwrap().trim(),
        "1",
        "one process only, no retry after cancel"
    );
    assert!(r.cancel("nope").await.is_err());
}

#[tokio::test]
async fn missing_program_fails_clearly() {
    let r = LocalRunner::new(LocalConfig {
        command: vec!["/nonexistent/bootplane".into(), "provision".into()],
        ..Default::default()
    })
    .unwrap();
    let id = r.start(request(None)).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(10)).await;
    assert_eq!(s.state, JobState::Failed);
    assert!(s
        .reason
        .unwrap()
        .starts_with("starting /nonexistent/bootplane: "));
}

/// The argument contract with the real `bootplane provision`: its CLI accepts what the
/// runner passes (any failure is about the source, not the arguments).
#[tokio::test]
async fn real_bootplane_provision_accepts_the_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let r = LocalRunner::new(LocalConfig {
        command: vec![env!("CARGO_BIN_EXE_bootplane").into(), "provision".into()],
        timeout_secs: 30,
        retry: no_retry(),
        ..Default::default()
    })
    .unwrap();
    let mut req = request(None);
    req.nfs = None;
    req.source = Some(dir.path().join("missing.img.zst").display().to_string());
    req.target = dir.path().join("disk.img").display().to_string();
    let id = r.start(req).await.unwrap();
    let s = wait_done(&r, &id, Duration::from_secs(30)).await;
    assert_eq!(
        s.state,
        JobState::Failed,
        "a missing source cannot succeed: {s:?}"
    );
    let reason = s.reason.unwrap();
    assert!(reason.starts_with("exit code "), "{reason}");
    assert!(
        !reason.contains("unexpected argument") && !reason.contains("Usage"),
        "CLI rejected the runner's arguments: {reason}"
    );
}

#[tokio::test]
async fn rest_endpoints() {
    let f = Fake::new(&["ok"]);
    let runner: Arc<dyn JobRunner> = Arc::new(f.runner(20, no_retry()));
    let app = bootplane::provision::router(runner);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = format!("http://{addr}/apis/bootplane.dev/v1alpha1/jobs");

    // The appliance chooses job ids: one given in the body is refused (it could be a
    // ServerAction's).
    let res = c
        .post(&base)
        .json(&request(Some("act-42")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 422);
    let res = c.post(&base).json(&request(None)).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let s: JobStatus = res.json().await.unwrap();
    assert_eq!(s.server, "s390-01");
    assert_eq!(s.request_sha256, Some(request(None).digest()));
    let id = s.id;

    let start = Instant::now();
    let s = loop {
        let s: serde_json::Value = c
            .get(format!("{base}/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if s["state"] == "Succeeded" || s["state"] == "Failed" {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(s["state"], "Succeeded");
    assert_eq!(s["progress"]["bytes"], 4096);
    assert_eq!(s["progress"]["total"], 4096);

    let res = c.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(res.status(), 404);
    assert!(res.json::<serde_json::Value>().await.unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("nope"));

    let mut bad = request(None);
    bad.sha256 = Some("xyz".into());
    let res = c.post(&base).json(&bad).send().await.unwrap();
    assert_eq!(res.status(), 400);
    assert!(res.json::<serde_json::Value>().await.unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("sha256"));
    let res = c
        .post(&base)
        .header("content-type", "application/json")
        .body("{\"server\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let res = c.delete(format!("{base}/{id}")).send().await.unwrap();
    assert_eq!(res.status(), 200, "cancelling a finished job is a no-op");
    assert_eq!(
        res.json::<serde_json::Value>().await.unwrap()["state"],
        "Succeeded"
    );
    server.abort();
}
