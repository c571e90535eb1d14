//! Real Kubernetes clients against bootplane: `kubectl` with a kubeconfig holding the
//! appliance's CA and a token, run with a private `HOME` (its discovery and OpenAPI
//! caches die with the test); the kubeconfig alone for the other clients.
//!
//! Two kubectls: the one on `PATH` (this machine's v1.32, the `kubectl` package of
//! google-cloud-cli), and Debian's `kubernetes-client` (v1.20, bookworm's), fetched with
//! `apt-get download` and unpacked under `CARGO_TARGET_TMPDIR`: installing it would
//! overwrite the other's `/usr/bin/kubectl`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::process::{must, run_bounded, wait_output};

pub struct Kubectl {
    pub bin: PathBuf,
    home: tempfile::TempDir,
    pub config: PathBuf,
    /// The API's URL and the CA it is trusted by (for [`Kubectl::with_token`]).
    server: String,
    ca: PathBuf,
}

impl Kubectl {
    /// A kubectl `bin` for the API at `server` (`https://127.0.0.1:PORT`), trusting only
    /// `ca`, authenticated by `token`.
    pub fn new(bin: &Path, server: &str, ca: &Path, token: &str) -> Kubectl {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join("kubeconfig");
        write_kubeconfig(&config, server, ca, token);
        Kubectl {
            bin: bin.to_path_buf(),
            home,
            config,
            server: server.to_string(),
            ca: ca.to_path_buf(),
        }
    }

    /// The same kubectl and server with another token (its own caches).
    pub fn with_token(&self, token: &str) -> Kubectl {
        Kubectl::new(&self.bin, &self.server, &self.ca, token)
    }

    /// `kubectl ARGS` with `stdin`, within 60 s: (exit code, stdout, stderr).
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", &self.config)
            .env("HOME", self.home.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        if let Some(s) = stdin {
            let mut w = child.stdin.take().unwrap();
            w.write_all(s.as_bytes()).unwrap();
        }
        let what = format!("kubectl {args:?}");
        let o = wait_output(child, Duration::from_secs(60), &what);
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// `kubectl ARGS` left running (a watch), stdout piped; killed on drop of the
    /// returned [`super::process::Proc`].
    pub fn spawn(&self, args: &[&str]) -> super::process::Proc {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", &self.config)
            .env("HOME", self.home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        super::process::Proc::spawn(c)
    }

    /// `kubectl edit ARGS` with an editor that runs `sed -i SCRIPT` on the file kubectl
    /// opens, within 60 s: (exit code, stdout, stderr).
    pub fn edit(&self, args: &[&str], sed: &str) -> (i32, String, String) {
        let editor = self.home.path().join("edit.sh");
        let quoted = sed.replace('\'', "'\\''");
        std::fs::write(&editor, format!("#!/bin/sh\nsed -i '{quoted}' \"$1\"\n")).unwrap();
        let exec = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(&editor, exec).unwrap();
        let mut c = Command::new(&self.bin);
        c.arg("edit")
            .args(args)
            .env("KUBECONFIG", &self.config)
            .env("HOME", self.home.path())
            .env("KUBE_EDITOR", &editor)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = c.spawn().unwrap();
        let o = wait_output(
            child,
            Duration::from_secs(60),
            &format!("kubectl edit {args:?}"),
        );
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// [`Kubectl::run`], which must succeed: its stdout.
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (code, out, err) = self.run(args, stdin);
        assert_eq!(code, 0, "kubectl {args:?}\nstdout: {out}\nstderr: {err}");
        out
    }

    /// The client's minor version (`32` for v1.32).
    pub fn minor(&self) -> u32 {
        let out = self.ok(&["version", "--client", "-o", "json"], None);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let minor = v["clientVersion"]["minor"].as_str().unwrap_or_default();
        minor
            .trim_end_matches('+')
            .parse()
            .unwrap_or_else(|_| panic!("client version {v}"))
    }
}

/// A kubeconfig at `path` for the API at `server`, trusting only `ca`, with `token`.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, token: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: bootplane\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
         users:\n- name: u\n  user:\n    token: {token}\n\
         contexts:\n- name: bootplane\n  context:\n    cluster: bootplane\n    user: u\n\
         current-context: bootplane\n",
        ca.display()
    );
    std::fs::write(path, text).unwrap();
}

/// This machine's kubectl (v1.32): fails, never skips, when there is none.
pub fn system_kubectl() -> PathBuf {
    super::require::require("kubectl");
    PathBuf::from("/usr/bin/kubectl")
}

/// Debian's kubectl (`kubernetes-client`, v1.20 in bookworm), downloaded once into
/// `CARGO_TARGET_TMPDIR/kubernetes-client` and unpacked there.
pub fn debian_kubectl() -> PathBuf {
    let _lock = super::data::cache_lock("kubernetes-client");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-client");
    let bin = cache.join("root/usr/bin/kubectl");
    if bin.is_file() {
        return bin;
    }
    std::fs::create_dir_all(&cache).unwrap();
    let find_deb = || {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with("kubernetes-client_") && n.ends_with(".deb")
            })
    };
    let deb = match find_deb() {
        Some(d) => d,
        None => {
            let mut c = Command::new("apt-get");
            c.args(["download", "kubernetes-client"])
                .current_dir(&cache);
            let out = run_bounded(c, 300);
            assert!(
                out.status.success(),
                "apt-get download kubernetes-client: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            find_deb().expect("downloaded kubernetes-client package")
        }
    };
    let tmp = cache.join("root.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    must(
        "dpkg-deb",
        &["-x", deb.to_str().unwrap(), tmp.to_str().unwrap()],
    );
    let _ = std::fs::remove_dir_all(cache.join("root"));
    std::fs::rename(&tmp, cache.join("root")).unwrap();
    assert!(bin.is_file(), "no usr/bin/kubectl in {}", deb.display());
    bin
}
