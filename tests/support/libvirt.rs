//! A private libvirt daemon per test, inside the test's network namespace, and
//! sushy-emulator's libvirt driver in front of it: a Redfish BMC whose systems are real
//! QEMU (TCG) VMs.
//!
//! [`Libvirtd::start`] runs Debian's `libvirtd` (packages `libvirt-daemon`,
//! `libvirt-daemon-driver-qemu`; `virsh` from `libvirt-clients`) as
//! `ip netns exec NS unshare -m -- sh -c '… exec libvirtd'`: in its own mount namespace
//! the test's directories are bind-mounted over `/etc/libvirt`, `/run/libvirt`,
//! `/var/lib/libvirt`, `/var/cache/libvirt` and `/var/log/libvirt` (so configs, sockets,
//! domain state and logs are the test's, and two daemons can run at once), and over
//! `/etc/passwd` and `/etc/group` with a `libvirt-qemu` entry added (the QEMU driver
//! resolves its compiled-in user at start-up; `libvirt-daemon-system`, which would create
//! it, also ships init scripts that start a host-wide daemon). `qemu.conf` runs QEMU as
//! root without a security driver, namespaces or cgroups, and logs to files (no
//! virtlogd, no systemd). Because the daemon lives in the test's network namespace, the
//! taps it creates for `<interface type='bridge'>` are there too, on the bridge the test
//! made: nothing touches the host network. Clients reach it at
//! `qemu:///system?socket=<dir>/run/libvirt-sock`; the mount points themselves (empty
//! directories) are created on the host if missing.
//!
//! The daemon defines and starts a `default` storage pool (a directory under the test's
//! dir): sushy-emulator uploads every virtual-media or HttpBootUri image into it.
//!
//! [`Sushy::start`] runs `sushy-emulator` (sushy-tools 2.2.0 from the test virtualenv
//! `/opt/bootplane-test-venv`, created by scripts/test.sh with Debian's python3 and
//! `--system-site-packages` so `python3-libvirt` imports) inside the namespace with
//! `--libvirt-uri` pointing at the daemon, its TMPDIR (where it downloads media and keeps
//! its state) under the test's dir.
//!
//! Drop destroys and undefines every domain defined here, then kills the daemon (the
//! namespace's own Drop kills whatever is left in it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::netns::Netns;
use super::process::{read, run_for, wait_for, Proc};
use super::require::{require_file, require_tools};

/// The virtualenv scripts/test.sh creates with sushy-tools in it.
pub const VENV: &str = "/opt/bootplane-test-venv";

/// Mount points the daemon's private mount namespace gets (host path, dir under ours).
const MOUNTS: [(&str, &str); 5] = [
    ("/etc/libvirt", "etc"),
    ("/run/libvirt", "run"),
    ("/var/lib/libvirt", "lib"),
    ("/var/cache/libvirt", "cache"),
    ("/var/log/libvirt", "log"),
];

const LIBVIRTD_CONF: &str = r#"# bootplane tests: a private daemon, root-only sockets in the test's dir
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:stderr"
"#;

const QEMU_CONF: &str = r#"# bootplane tests: no systemd, no KVM, no confinement
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
stdio_handler = "file"
"#;

/// Fail (never skip) unless libvirt, its Python binding and sushy-emulator are there.
pub fn require_libvirt() {
    require_tools(&["ip", "unshare", "libvirtd", "virsh", "qemu-system-x86_64"]);
    require_file(
        "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so",
        "libvirt-daemon-driver-qemu",
    );
    require_file(
        "/usr/lib/python3/dist-packages/libvirt.py",
        "python3-libvirt",
    );
    require_file("/usr/share/seabios/bios-256k.bin", "seabios");
    require_file("/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf");
    let sushy = format!("{VENV}/bin/sushy-emulator");
    assert!(
        Path::new(&sushy).is_file(),
        "{sushy} missing: scripts/test.sh creates the test virtualenv with sushy-tools"
    );
}

/// The domain's firmware. sushy-tools 2.2.0 reports boot mode UEFI, and offers
/// `UefiHttp` in `BootSourceOverrideTarget@Redfish.AllowableValues`, exactly when the
/// domain's `<loader>` is of type `pflash`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Firmware {
    /// SeaBIOS as QEMU's `-bios` (sushy: boot mode Legacy).
    SeaBios,
    /// OVMF as `pflash`, NVRAM from Debian's VARS template (kept under the daemon's
    /// `/var/lib/libvirt`).
    Ovmf,
}

/// One VM: SeaBIOS (serial console mirrored to COM1) or OVMF, one NIC on `bridge`,
/// COM1 to a file.
pub struct DomainSpec<'a> {
    pub name: &'a str,
    pub firmware: Firmware,
    pub uuid: &'a str,
    pub mac: &'a str,
    pub bridge: &'a str,
    pub memory_mib: u32,
    pub serial_log: &'a Path,
}

impl DomainSpec<'_> {
    /// The domain XML: type `qemu` (TCG), i440fx, no disk, no graphics. No boot order:
    /// sushy-emulator writes the per-device `<boot order>` a Redfish override asks for.
    pub fn xml(&self) -> String {
        let firmware = match self.firmware {
            Firmware::SeaBios => "<bios useserial='yes'/>",
            Firmware::Ovmf => {
                "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>\n    \
                 <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'/>"
            }
        };
        format!(
            r#"<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{mem}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    {firmware}
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='usb' model='none'/>
    <interface type='bridge'>
      <source bridge='{bridge}'/>
      <mac address='{mac}'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='{serial}' append='on'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
"#,
            name = self.name,
            uuid = self.uuid,
            mem = self.memory_mib,
            bridge = self.bridge,
            mac = self.mac,
            serial = self.serial_log.display(),
        )
    }
}

/// A libvirt daemon inside a test's network namespace (see the module doc).
pub struct Libvirtd {
    dir: PathBuf,
    proc: Option<Proc>,
    domains: Mutex<Vec<String>>,
}

impl Libvirtd {
    /// Start a daemon in `ns` whose files all live under `dir` (created), with a
    /// started `default` storage pool; waits until `virsh` gets an answer.
    pub fn start(ns: &Netns, dir: &Path) -> Libvirtd {
        require_libvirt();
        for (_, sub) in MOUNTS {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::create_dir_all(dir.join("pool")).unwrap();
        std::fs::write(dir.join("etc/libvirtd.conf"), LIBVIRTD_CONF).unwrap();
        std::fs::write(dir.join("etc/qemu.conf"), QEMU_CONF).unwrap();
        let mut passwd = read(Path::new("/etc/passwd"));
        let mut group = read(Path::new("/etc/group"));
        if !passwd.contains("\nlibvirt-qemu:") {
            passwd.push_str(
                "libvirt-qemu:x:64055:64055:libvirt:/var/lib/libvirt:/usr/sbin/nologin\n",
            );
        }
        for g in ["libvirt-qemu:x:64055:", "kvm:x:64056:"] {
            let name = &g[..g.find(':').unwrap() + 1];
            if !group.starts_with(name) && !group.contains(&format!("\n{name}")) {
                group.push_str(g);
                group.push('\n');
            }
        }
        std::fs::write(dir.join("passwd"), passwd).unwrap();
        std::fs::write(dir.join("group"), group).unwrap();

        let mut script = String::from("set -e\n");
        for (host, sub) in MOUNTS {
            script.push_str(&format!(
                "mkdir -p {host} && mount --bind {d}/{sub} {host}\n",
                d = dir.display()
            ));
        }
        for f in ["passwd", "group"] {
            script.push_str(&format!("mount --bind {}/{f} /etc/{f}\n", dir.display()));
        }
        script.push_str(&format!(
            "exec libvirtd --config /etc/libvirt/libvirtd.conf --pid-file {}/libvirtd.pid\n",
            dir.display()
        ));
        let log = std::fs::File::create(dir.join("libvirtd.log")).unwrap();
        let mut c = ns.cmd("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let log_path = dir.join("libvirtd.log");
        let mut d = Libvirtd {
            dir: dir.to_path_buf(),
            proc: Some(Proc::spawn(c)),
            domains: Mutex::new(Vec::new()),
        };
        wait_for(
            Duration::from_secs(30),
            || {
                if let Some(Ok(Some(st))) = d.proc.as_mut().map(|p| p.child.try_wait()) {
                    panic!("libvirtd exited ({st}): {}", d.log());
                }
                d.dir.join("run/libvirt-sock").exists() && d.virsh(&["version"]).status.success()
            },
            || format!("libvirtd did not answer: {}", read(&log_path)),
        );
        d.must(&[
            "pool-define-as",
            "default",
            "dir",
            "--target",
            d.dir.join("pool").to_str().unwrap(),
        ]);
        d.must(&["pool-start", "default"]);
        d
    }

    /// The URI a client (virsh, sushy-emulator) uses for this daemon.
    pub fn uri(&self) -> String {
        format!(
            "qemu:///system?socket={}",
            self.dir.join("run/libvirt-sock").display()
        )
    }

    /// The daemon's own log (stderr).
    pub fn log(&self) -> String {
        read(&self.dir.join("libvirtd.log"))
    }

    /// QEMU's log for domain `name` (its command line and errors).
    pub fn qemu_log(&self, name: &str) -> String {
        read(&self.dir.join(format!("log/qemu/{name}.log")))
    }

    /// `virsh -c URI ARGS…` within 60 s.
    pub fn virsh(&self, args: &[&str]) -> Output {
        let mut c = Command::new("virsh");
        c.arg("-c").arg(self.uri()).args(args);
        run_for(&mut c, Duration::from_secs(60))
    }

    /// [`Libvirtd::virsh`]; panics unless it succeeds; returns its stdout.
    pub fn must(&self, args: &[&str]) -> String {
        let o = self.virsh(args);
        assert!(
            o.status.success(),
            "virsh {args:?}: {}{}\n--- libvirtd ---\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Define (not start) a domain; it is destroyed and undefined on drop.
    pub fn define(&self, spec: &DomainSpec) {
        let path = self.dir.join(format!("{}.xml", spec.name));
        std::fs::write(&path, spec.xml()).unwrap();
        self.must(&["define", path.to_str().unwrap()]);
        self.domains.lock().unwrap().push(spec.name.to_string());
    }

    /// Define (not start) domain `name` from its XML; destroyed and undefined on drop.
    pub fn define_xml(&self, name: &str, xml: &str) {
        let path = self.dir.join(format!("{name}.xml"));
        std::fs::write(&path, xml).unwrap();
        self.must(&["define", path.to_str().unwrap()]);
        self.domains.lock().unwrap().push(name.to_string());
    }

    /// `virsh domstate NAME`: "running", "shut off", …
    pub fn state(&self, name: &str) -> String {
        self.must(&["domstate", name]).trim().to_string()
    }

    /// The domain's persistent XML (what a next start uses).
    pub fn inactive_xml(&self, name: &str) -> String {
        self.must(&["dumpxml", "--inactive", name])
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        if self.proc.is_none() {
            return;
        }
        let domains = std::mem::take(&mut *self.domains.lock().unwrap());
        for d in domains {
            let _ = self.virsh(&["destroy", &d]);
            let _ = self.virsh(&["undefine", &d]);
        }
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }
}

/// sushy-emulator with its libvirt driver, listening on `ip:port` inside the namespace.
pub struct Sushy {
    pub base: String,
    log: PathBuf,
    proc: Proc,
}

impl Sushy {
    /// Start it in `ns` against `libvirt_uri`; its TMPDIR (downloads, state) is
    /// `dir/sushy-tmp`. Waits until `/redfish/v1/Systems` answers.
    /// With `user`, it asks for HTTP basic auth with that user and password (a bcrypt
    /// htpasswd file, `SUSHY_EMULATOR_AUTH_FILE`); sushy-tools has no SessionService.
    pub fn start(
        ns: &Netns,
        dir: &Path,
        libvirt_uri: &str,
        (ip, port): (&str, u16),
        user: Option<(&str, &str)>,
    ) -> Sushy {
        require_libvirt();
        let tmp = dir.join("sushy-tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let log = dir.join("sushy.log");
        let f = std::fs::File::create(&log).unwrap();
        let mut c = ns.cmd(&format!("{VENV}/bin/sushy-emulator"));
        c.args(["--interface", ip, "--port", &port.to_string()])
            .args(["--libvirt-uri", libvirt_uri])
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if let Some((u, p)) = user {
            let htpasswd = dir.join("sushy.htpasswd");
            let hash = run_for(
                Command::new(format!("{VENV}/bin/python3")).args([
                    "-c",
                    "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
                    p,
                ]),
                Duration::from_secs(30),
            );
            assert!(hash.status.success(), "bcrypt: {hash:?}");
            let hash = String::from_utf8(hash.stdout).unwrap();
            std::fs::write(&htpasswd, format!("{u}:{}\n", hash.trim())).unwrap();
            let conf = dir.join("sushy.conf");
            std::fs::write(
                &conf,
                format!(
                    "SUSHY_EMULATOR_AUTH_FILE = {:?}\n",
                    htpasswd.display().to_string()
                ),
            )
            .unwrap();
            c.arg("--config").arg(&conf);
        }
        c.env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        let mut s = Sushy {
            base: format!("http://{ip}:{port}"),
            log,
            proc: Proc::spawn(c),
        };
        // The service root needs no credentials, with or without auth.
        let url = format!("{}/redfish/v1/", s.base);
        let ns_name = ns.name.clone();
        wait_for(
            Duration::from_secs(30),
            || {
                if let Ok(Some(st)) = s.proc.child.try_wait() {
                    panic!("sushy-emulator exited ({st}): {}", read(&s.log));
                }
                curl_ok(&ns_name, &url)
            },
            || format!("sushy-emulator did not answer: {}", read(&s.log)),
        );
        s
    }

    /// What it printed (requests, errors).
    pub fn log(&self) -> String {
        read(&self.log)
    }
}

/// Whether `curl URL` inside namespace `ns` gets a 2xx answer.
fn curl_ok(ns: &str, url: &str) -> bool {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sf",
            "-o",
            "/dev/null",
            "-m",
            "2",
            url,
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
