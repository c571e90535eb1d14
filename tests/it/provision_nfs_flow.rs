//! The provisioning path of the s390x flow without the store: an export on bootplane's
//! ganesha backend, a rule for the job's address, a local job that copies the image
//! over NFS into a target file and verifies its SHA-256, then the rule deleted and the
//! same job failing with a clear reason.
//!
//! Until `bootplane provision` has its nfs:// source (branch `image`), the job command is
//! a small provisioner script built on the real libnfs client `nfs-cp`; it takes the
//! same arguments and speaks the same JSON progress lines. The runner and the NFS
//! server are bootplane's. Everything runs in a network namespace this test creates
//! (client address 127.0.0.2/127.0.0.3 via local routes, see tests/support/netns.rs).

use std::path::Path;
use std::time::{Duration, Instant};

use bootplane::nfs::ganesha::{Ganesha, GaneshaConfig};
use bootplane::nfs::{ExportBackend, ExportRule};
use bootplane::provision::local::{LocalConfig, LocalRunner, RetryPolicy};
use bootplane::provision::{JobRunner, JobState, JobStatus, NfsSource, ProvisionRequest};

use crate::support;
use support::data::{sha256_file, sha256_hex};
use support::netns::Netns;
use support::require::require_tools;

/// Provisioner stand-in: `--source URL --target PATH --sha256 HEX`, copies with nfs-cp,
/// verifies, zeroes the first MiB on mismatch, reports JSON progress on stderr.
const PROVISIONER: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    --source) src="$2"; shift 2 ;;
    --target) dst="$2"; shift 2 ;;
    --sha256) sum="$2"; shift 2 ;;
    *) shift ;;
  esac
done
echo '{"stage":"read","bytes":0}' >&2
if ! err=$(nfs-cp "$src" "$dst" 2>&1); then
  printf '{"stage":"error","error":"reading %s: %s"}\n' "$src" "$(echo "$err" | tr -d '"\n' | head -c 300)" >&2
  exit 4
fi
size=$(stat -c %s "$dst")
printf '{"stage":"verify","bytes":%s,"total":%s}\n' "$size" "$size" >&2
got=$(sha256sum "$dst" | cut -d' ' -f1)
if [ "$got" != "$sum" ]; then
  dd if=/dev/zero of="$dst" bs=1M count=1 conv=notrunc 2>/dev/null
  printf '{"stage":"error","error":"sha256 mismatch: expected %s, got %s"}\n' "$sum" "$got" >&2
  exit 3
fi
printf '{"stage":"done","bytes":%s,"total":%s}\n' "$size" "$size" >&2
"#;

async fn wait_done(r: &dyn JobRunner, id: &str) -> JobStatus {
    let start = Instant::now();
    loop {
        let s = r.status(id).await.unwrap();
        if s.state.is_finished() {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "job not finished: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_reads_image_over_nfs_only_while_its_rule_exists() {
    require_tools(&["ganesha.nfsd", "rpcbind", "nfs-cp", "sha256sum"]);
    let ns = Netns::with_loopback_sources("flow");

    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    // A 3 MiB + 123 byte image with non-repeating content.
    let mut img = Vec::with_capacity(3 << 20);
    let mut x: u64 = 0x9e3779b97f4a7c15;
    while img.len() < (3 << 20) + 123 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        img.extend_from_slice(&x.to_le_bytes());
    }
    img.truncate((3 << 20) + 123);
    std::fs::write(images.join("disk.img"), &img).unwrap();
    let want = sha256_hex(&img);
    let script = tmp.path().join("provisioner.sh");
    std::fs::write(&script, PROVISIONER).unwrap();

    let g = Ganesha::new(
        GaneshaConfig {
            dir: Some(tmp.path().join("ganesha")),
            netns: Some(ns.name.clone()),
            ..Default::default()
        },
        tmp.path(),
    )
    .unwrap();
    let runner = LocalRunner::new(LocalConfig {
        command: vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns.name.clone(),
            "sh".into(),
            script.display().to_string(),
        ],
        timeout_secs: 60,
        retry: RetryPolicy {
            max_retries: 0,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let request = |id: &str, target: &Path, sha: &str| ProvisionRequest {
        id: Some(id.into()),
        server: "s390-01".into(),
        image: Some("disk".into()),
        nfs: Some(NfsSource {
            server: "127.0.0.2".into(),
            export: "/images/disk".into(),
            path: "disk.img".into(),
        }),
        source: None,
        sha256: Some(sha.into()),
        manifest: None,
        target: target.display().to_string(),
        resolved_target: None,
    };

    let result = tokio::time::timeout(Duration::from_secs(150), async {
        // Image import: export with no rules. The job's address (127.0.0.2) is denied.
        g.ensure_export("/images/disk", &images).await.unwrap();
        let target = tmp.path().join("target-0.img");
        let s = wait_done(
            &runner,
            &runner
                .start(request("before-rule", &target, &want))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s.state, JobState::Failed);
        let reason = s.reason.unwrap();
        assert!(
            reason.starts_with("exit code 4: reading nfs://127.0.0.2")
                && reason.contains("Permission denied"),
            "{reason}"
        );

        // Server controller: rule for the job's address → the job streams the image.
        g.set_rules(
            "/images/disk",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        let target = tmp.path().join("target-1.img");
        let s = wait_done(
            &runner,
            &runner
                .start(request("with-rule", &target, &want))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s.state, JobState::Succeeded, "{s:?}");
        assert_eq!(sha256_file(&target), want);
        assert_eq!(
            (s.progress.bytes, s.progress.total),
            (img.len() as u64, Some(img.len() as u64))
        );

        // Checksum mismatch: Failed with the reason, first MiB of the target zeroed.
        let target = tmp.path().join("target-2.img");
        let wrong = "0".repeat(64);
        let s = wait_done(
            &runner,
            &runner
                .start(request("bad-sum", &target, &wrong))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s.state, JobState::Failed);
        assert!(
            s.reason.as_deref().unwrap().starts_with(&format!(
                "exit code 3: sha256 mismatch: expected {wrong}, got {want}"
            )),
            "{s:?}"
        );
        let written = std::fs::read(&target).unwrap();
        assert!(written[..1 << 20].iter().all(|b| *b == 0));

        // BareMetalServer deleted: rule gone → access revoked at once.
        g.set_rules("/images/disk", vec![]).await.unwrap();
        let target = tmp.path().join("target-3.img");
        let s = wait_done(
            &runner,
            &runner
                .start(request("after-delete", &target, &want))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s.state, JobState::Failed);
        assert!(s.reason.unwrap().contains("Permission denied"));

        // NFS server down: the job fails with the client's error, health says why.
        g.set_rules(
            "/images/disk",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        g.stop().await;
        let s = wait_done(
            &runner,
            &runner
                .start(request("server-down", &tmp.path().join("t4"), &want))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s.state, JobState::Failed);
        assert!(
            s.reason
                .as_deref()
                .unwrap()
                .starts_with("exit code 4: reading nfs://127.0.0.2"),
            "{s:?}"
        );
        assert!(g
            .health()
            .await
            .unwrap_err()
            .to_string()
            .contains("nfs-ganesha is not running"));
    })
    .await;
    g.stop().await;
    result.expect("test timed out");
}
