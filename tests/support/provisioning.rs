//! Provisioning flow test helpers (the `provisioning.bootplane.dev` group): a network
//! namespace the test creates (ganesha and the provisioning jobs run in it; loopback
//! addresses 127.0.0.2-4 get `local` routes with themselves as source, so an NFS client
//! that connects to 127.0.0.N is seen by the server as 127.0.0.N), a `bootplane serve`
//! configured for the flow, and REST/NFS helpers. All traffic stays on loopback inside
//! that namespace.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::bootplane::{bin, tail, Bootplane};
use super::data::sha256_hex;
use super::netns::Netns;
use super::nfs::{assert_denied, nfs_client};
use super::require::require_tools;

pub const API: &str = "/apis/provisioning.bootplane.dev/v1alpha1/namespaces/default";

/// The programs the flow runs: fail (never skip) when one is missing.
pub fn require_flow_tools() {
    require_tools(&[
        "ganesha.nfsd",
        "rpcbind",
        "nfs-cat",
        "ip",
        "unshare",
        "timeout",
    ]);
}

#[derive(Default)]
pub struct Options {
    /// Limit each job's copy rate (bytes/s), to have time to act mid-copy.
    pub max_rate: Option<u64>,
    pub max_retries: u32,
    pub retry_exit_codes: Vec<i32>,
}

/// bootplane serve with the NFS backend (ganesha in the test's namespace) and the
/// local job runner (jobs run in the namespace too, through a wrapper script that logs
/// every job start: `<job id> <pid>` per line in `starts`).
pub struct Flow {
    pub ns: Netns,
    pub tmp: tempfile::TempDir,
    pub images: PathBuf,
    pub starts: PathBuf,
    /// When this file exists, the ganesha wrapper refuses to start (NFS server down).
    pub down_flag: PathBuf,
    pub bp: Bootplane,
}

impl Flow {
    pub fn start(o: Options) -> Flow {
        require_flow_tools();
        let ns = Netns::with_loopback_sources("prov");
        let tmp = tempfile::tempdir().unwrap();
        let images = tmp.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let starts = tmp.path().join("starts");
        let job = tmp.path().join("job.sh");
        let rate = o
            .max_rate
            .map(|r| format!("--max-rate {r} "))
            .unwrap_or_default();
        std::fs::write(
            &job,
            format!(
                "#!/bin/sh\necho \"$BOOTPLANE_JOB_ID $$\" >> {starts}\nexec ip netns exec {ns} {bin} provision {rate}\"$@\"\n",
                starts = starts.display(),
                ns = ns.name,
                bin = bin(),
            ),
        )
        .unwrap();
        let down_flag = tmp.path().join("nfs-down");
        let ganesha = tmp.path().join("ganesha.sh");
        std::fs::write(
            &ganesha,
            format!(
                "#!/bin/sh\nif [ -e {flag} ]; then echo 'simulated outage' >&2; exit 1; fi\nexec ganesha.nfsd \"$@\"\n",
                flag = down_flag.display()
            ),
        )
        .unwrap();
        let codes: Vec<String> = o.retry_exit_codes.iter().map(|c| c.to_string()).collect();
        let sets = [
            "nfs.enabled=true".to_string(),
            format!("nfs.ganesha.netns={:?}", ns.name),
            format!(
                "nfs.ganesha.ganesha_bin={:?}",
                ganesha.display().to_string()
            ),
            format!("provision.images_dir={:?}", images.display().to_string()),
            "provision.nfs_server=\"127.0.0.2\"".to_string(),
            "provision.job_address=\"127.0.0.2\"".to_string(),
            // Jobs write their file targets in the test's directory only.
            format!(
                "provision.jobs.target_dir={:?}",
                tmp.path().display().to_string()
            ),
            format!(
                "provision.local.command=[\"sh\", {:?}]",
                job.display().to_string()
            ),
            "provision.local.timeout_secs=120".to_string(),
            format!("provision.local.retry.max_retries={}", o.max_retries),
            "provision.local.retry.backoff_ms=200".to_string(),
            format!("provision.local.retry.exit_codes=[{}]", codes.join(",")),
        ];
        // ganesha_bin is a program path (run as "$2" by the backend's launcher), so the
        // wrapper must be executable itself.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ganesha, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut extra: Vec<String> = Vec::new();
        for s in sets {
            extra.push("--set".into());
            extra.push(s);
        }
        let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
        let bp = Bootplane::start(&refs);
        Flow {
            ns,
            tmp,
            images,
            starts,
            down_flag,
            bp,
        }
    }

    /// Put an image file at `<images>/<dir>/<file>`; returns its SHA-256.
    pub fn write_image(&self, dir: &str, file: &str, data: &[u8]) -> String {
        std::fs::create_dir_all(self.images.join(dir)).unwrap();
        std::fs::write(self.images.join(dir).join(file), data).unwrap();
        sha256_hex(data)
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    /// `bootplane apply -f -` with `yaml`.
    pub fn apply(&self, yaml: &str) {
        let (code, out, err) = self.bp.cli_stdin(&["apply", "-f", "-"], Some(yaml));
        assert_eq!(code, 0, "apply failed: {out} {err}");
    }

    pub fn image_yaml(name: &str, source: &str, sha: &str, retention: &str) -> String {
        format!(
            "apiVersion: provisioning.bootplane.dev/v1alpha1\nkind: Image\nmetadata:\n  name: {name}\nspec:\n  source: {source}\n  format: raw\n  sha256: {sha}\n  retentionPolicy: {retention}\n"
        )
    }

    pub fn spec_yaml(name: &str, image: &str, target: &Path) -> String {
        format!(
            "apiVersion: provisioning.bootplane.dev/v1alpha1\nkind: BareMetalSpec\nmetadata:\n  name: {name}\n  labels:\n    provisioning.bootplane.dev/image-id: {image}\nspec:\n  target: {}\n",
            target.display()
        )
    }

    /// GET an object of the flow's group; None when absent.
    pub fn obj(&self, plural: &str, name: &str) -> Option<Value> {
        let (code, v) = self.bp.call("GET", &format!("{API}/{plural}/{name}"), None);
        match code {
            200 => Some(v),
            404 => None,
            c => panic!("GET {plural}/{name}: {c} {v}"),
        }
    }

    pub fn list(&self, plural: &str) -> Vec<Value> {
        self.bp.get(&format!("{API}/{plural}"))["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Wait until `plural/name` exists and `f` holds for it.
    pub fn wait_obj(
        &self,
        secs: u64,
        plural: &str,
        name: &str,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut last = None;
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let o = self.obj(plural, name);
            if let Some(o) = &o {
                if f(o) {
                    return o.clone();
                }
            }
            last = o.or(last);
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {plural}/{name}; last seen: {}\nlog tail:\n{}",
                    last.map(|v| serde_json::to_string_pretty(&v).unwrap())
                        .unwrap_or_else(|| "absent".into()),
                    tail(&self.bp.log(), 60)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_gone(&self, secs: u64, plural: &str, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.obj(plural, name).is_some() {
            assert!(
                Instant::now() < deadline,
                "{plural}/{name} still exists; log tail:\n{}",
                tail(&self.bp.log(), 60)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Read `nfs://<addr>/<export>/<file>` with nfs-cat from `addr` (inside the
    /// namespace, the server sees the client as `addr`). Ok(bytes) or Err(stderr).
    pub fn nfs_cat(&self, addr: &str, export: &str, file: &str) -> Result<Vec<u8>, String> {
        nfs_client(&self.ns, "nfs-cat", &format!("nfs://{addr}{export}/{file}"))
    }

    pub fn assert_denied(&self, addr: &str, export: &str, file: &str, what: &str) {
        assert_denied(self.nfs_cat(addr, export, file), what);
    }

    /// Job starts logged by the wrapper: (job id, pid).
    pub fn starts(&self) -> Vec<(String, i32)> {
        std::fs::read_to_string(&self.starts)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (id, pid) = l.split_once(' ')?;
                Some((id.to_string(), pid.trim().parse().ok()?))
            })
            .collect()
    }

    pub fn ganesha_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.bp.dir.join("ganesha/ganesha.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

pub fn is_live(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

pub fn state(o: &Value) -> &str {
    o.pointer("/status/state")
        .and_then(Value::as_str)
        .unwrap_or("")
}
