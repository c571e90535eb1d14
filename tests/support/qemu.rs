//! The QEMU firmware lab of the end-to-end tests (tests/e2e_firmware.rs,
//! tests/e2e_cluster.rs): a namespace with a bridge `br0` (10.199.NET.1/24) where
//! bootplane serves DHCP, TFTP and HTTP and its `qemu` power driver starts VMs (SeaBIOS
//! or OVMF, QEMU's iPXE ROM) on taps of that bridge; the scenario runner (claim → boot
//! → console checks → conditions → unclaim); and the Linux pieces: Debian's kernel
//! (downloaded once with apt under target/) and an initramfs built here (busybox,
//! e1000.ko, the real `ignition` client) that fetches its Ignition config.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::api::condition_true;
use super::bootplane::{bootplane_cli, get_json_in, serve_in, tail};
use super::netns::Netns;
use super::process::*;
use super::require::*;

/// A `boot.ipxe` template for BIOS firmware whose NIC ROM is iPXE: chain `undionly.kpxe`
/// from TFTP (the PXE path of real firmware) unless iPXE already runs on the UNDI driver,
/// then the machine's script over HTTP, with the script token of bootplane's DHCP reply
/// (option 224, as the built-in `boot.ipxe` sends it). QEMU's ROM and a chained
/// `undionly.kpxe` send the same DHCP options, so only this check breaks the loop.
pub const UNDIONLY_CHAIN_BOOT: &str = "#!ipxe\n\
    echo bootplane-e2e: driver ${net0/chip}\n\
    iseq ${net0/chip} undionly && goto script ||\n\
    chain tftp://${next-server}/undionly.kpxe || goto failed\n\
    :script\n\
    echo bootplane: identifying ${net0/mac:hexhyp} (${uuid})\n\
    chain --autofree --replace {{ base_url }}/ipxe/script?uuid=${uuid}&mac=${net0/mac:hexhyp}&token=${224:uristring} || goto failed\n\
    :failed\n\
    echo bootplane: could not fetch this machine's script\n\
    exit 1\n";

/// One namespace with a bridge `br0` (10.199.NET.1/24) and bootplane inside.
pub struct QemuLab {
    pub ns: Netns,
    pub dir: tempfile::TempDir,
    pub net: u8,
    /// The lab's bootplane, once [`QemuLab::start`]ed.
    pub bp: Option<Proc>,
}

impl QemuLab {
    pub fn new(net: u8) -> QemuLab {
        let ns = Netns::new("q");
        ns.bridge("br0", &format!("10.199.{net}.1/24"));
        QemuLab {
            ns,
            dir: tempfile::tempdir().unwrap(),
            net,
            bp: None,
        }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn addr(&self, last: u8) -> String {
        format!("10.199.{}.{last}", self.net)
    }

    pub fn log(&self) -> String {
        read(&self.path("bootplane.log"))
    }

    /// Start bootplane with DHCP (authoritative), TFTP, HTTP and the qemu driver.
    pub fn start(&mut self, images: &Path, templates: &Path) {
        std::fs::write(self.path("bootplane.toml"), self.config(images, templates)).unwrap();
        self.bp = Some(serve_in(
            &self.ns,
            &self.path("bootplane.toml"),
            &self.path("bootplane.log"),
        ));
    }

    /// The lab's bootplane configuration: state in `state/`, DHCP (authoritative, on
    /// `br0`, NET.100-NET.150), TFTP and HTTP on NET.1 serving `assets/` (iPXE's
    /// `undionly.kpxe` and `ipxe.efi`, copied here), the image catalog `images`, the iPXE
    /// templates `templates`, the repo's Ignition templates, the `qemu` power driver on
    /// `br0`. The API listens on 127.0.0.1:9090 (the default) in the namespace.
    pub fn config(&self, images: &Path, templates: &Path) -> String {
        let assets = self.path("assets");
        std::fs::create_dir_all(&assets).unwrap();
        for f in ["undionly.kpxe", "ipxe.efi"] {
            std::fs::copy(Path::new("/usr/lib/ipxe").join(f), assets.join(f))
                .unwrap_or_else(|e| panic!("/usr/lib/ipxe/{f} (apt-get install ipxe): {e}"));
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        format!(
            r#"state_dir = "{state}"
[http]
listen = "{ip}:8080"
public_url = "http://{ip}:8080"
assets_dir = "{assets}"
[dhcp]
enabled = true
interface = "br0"
mode = "authoritative"
range = "{lo}-{hi}"
lease_time_secs = 600
[tftp]
enabled = true
listen = "{ip}:69"
root = "{assets}"
[boot]
images_dir = "{images}"
ipxe_templates = "{templates}"
ignition_templates = "{ign}"
[controller]
power_driver = "qemu"
[power.qemu]
bridge = "br0"
memory_mib = 512
stop_grace_ms = 1000
"#,
            state = self.path("state").display(),
            ip = self.addr(1),
            lo = self.addr(100),
            hi = self.addr(150),
            assets = assets.display(),
            images = images.display(),
            templates = templates.display(),
            ign = repo.join("ignition").display(),
        )
    }

    /// The bootplane CLI against this instance's API (inside the namespace).
    pub fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.ns, &self.path("state"), args, stdin)
    }

    pub fn get_json(&self, kind: &str, name: &str) -> Option<Value> {
        get_json_in(&self.ns, &self.path("state"), kind, name)
    }

    /// The VM's serial console as text (ANSI escape sequences removed).
    pub fn serial(&self, server: &str) -> String {
        serial_at(&self.path("state"), server)
    }

    /// How many qemu processes run in the namespace.
    pub fn qemu_count(&self) -> usize {
        qemu_pids(&self.ns).len()
    }

    pub fn qemu_running(&self) -> bool {
        self.qemu_count() > 0
    }

    /// Keep the console and bootplane's log under target/ for reading after the run.
    pub fn keep_logs(&self, server: &str) {
        keep_log(&format!("{server}.serial.log"), &self.serial(server));
        keep_log(&format!("{server}.bootplane.log"), &self.log());
    }
}

impl Drop for QemuLab {
    fn drop(&mut self) {
        // SIGKILL bootplane; its VMs die with it (PR_SET_PDEATHSIG), and the namespace's
        // Drop kills whatever is left and removes the namespace with its bridge and taps.
        if let Some(mut p) = self.bp.take() {
            p.kill9();
        }
    }
}

/// A VM's serial console under the state dir `state` of the appliance that runs it, as
/// text (ANSI escape sequences removed).
pub fn serial_at(state: &Path, server: &str) -> String {
    let raw = std::fs::read(state.join(format!("qemu/{server}/serial.log"))).unwrap_or_default();
    strip_ansi(&String::from_utf8_lossy(&raw))
}

/// The pids of the qemu processes running in `ns`.
pub fn qemu_pids(ns: &Netns) -> Vec<u32> {
    let out = Command::new("ip")
        .args(["netns", "pids", &ns.name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.starts_with("qemu"))
                .unwrap_or(false)
        })
        .filter_map(|pid| pid.parse().ok())
        .collect()
}

/// Keep `text` as `name` under target/ (`e2e-firmware/logs`) for reading after the run.
pub fn keep_log(name: &str, text: &str) {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-firmware/logs");
    let _ = std::fs::create_dir_all(&d);
    let _ = std::fs::write(d.join(name), text);
}

/// What one scenario does and expects.
pub struct Scenario<'a> {
    pub server: &'a str,
    pub mac_last: u8,
    pub firmware: &'a str,
    /// Serial console lines that must all appear, in this order.
    pub serial: &'a [&'a str],
    pub boot_limit: Duration,
    /// Also wait for IgnitionDataFetched.
    pub ignition: bool,
}

pub fn in_order(hay: &str, needles: &[&str]) -> Result<(), String> {
    let mut pos = 0;
    for n in needles {
        match hay[pos..].find(n) {
            Some(i) => pos += i + n.len(),
            None => return Err(n.to_string()),
        }
    }
    Ok(())
}

/// The objects of scenario `s` on lab network `net`, as YAML for `bootplane apply`: a
/// Server (MAC 52:54:00:e2:NET:LAST, UUID ending in LAST, the firmware annotation),
/// its Ignition Secret (a file whose contents are `hello-from-SERVER`) and a ServerClaim
/// `SERVER-claim` with `power: On`.
pub fn scenario_yaml(net: u8, s: &Scenario) -> String {
    let mac = format!("52:54:00:e2:{:02x}:{:02x}", net, s.mac_last);
    let ign = format!(
        r#"{{"ignition":{{"version":"3.3.0"}},"storage":{{"files":[{{"path":"/etc/e2e-marker","contents":{{"source":"data:,hello-from-{}"}}}}]}}}}"#,
        s.server
    );
    format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\n\
         metadata: {{name: {srv}, annotations: {{bootplane.dev/qemu-firmware: {fw}}}}}\n\
         spec: {{systemUUID: 4c4c4544-00e2-00e2-00e2-0000000000{last:02x}}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"{mac}\"}}]}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: {srv}-ign, namespace: default}}\nstringData: {{ignition: '{ign}'}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: {srv}-claim, namespace: default}}\n\
         spec: {{power: \"On\", image: \"os-image:latest\", serverRef: {{name: {srv}}}, ignitionSecretRef: {{name: {srv}-ign}}}}\n",
        srv = s.server,
        fw = s.firmware,
        last = s.mac_last,
    )
}

/// Wait until the console `serial()` shows `s.serial` in order, within `s.boot_limit`;
/// panics with the console, the first line missing and `diag()` (logs) otherwise.
pub fn wait_console(s: &Scenario, serial: impl Fn() -> String, diag: impl Fn() -> String) {
    let t0 = Instant::now();
    loop {
        let text = serial();
        if in_order(&text, s.serial).is_ok() {
            break;
        }
        if t0.elapsed() > s.boot_limit {
            panic!(
                "{}: console never showed {:?} within {:?}\n--- serial ---\n{}\n{}",
                s.server,
                in_order(&text, s.serial).unwrap_err(),
                s.boot_limit,
                text,
                diag()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "{}: booted to the expected console output in {:.1?}",
        s.server,
        t0.elapsed()
    );
}

/// Claim → boot → checks → unclaim, on a started lab.
pub fn run_scenario(lab: &QemuLab, s: &Scenario) {
    let yaml = scenario_yaml(lab.net, s);
    let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim = format!("{}-claim", s.server);
    wait_for(
        Duration::from_secs(30),
        || {
            lab.get_json("servers", s.server)
                .is_some_and(|v| v["status"]["powerState"] == "On")
        },
        || {
            format!(
                "server not powered on: {:?}\n{}",
                lab.get_json("servers", s.server),
                lab.log()
            )
        },
    );
    // One VM, however often the controller reconciles the powered-on server.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lab.qemu_count(), 1, "qemu processes after power On");

    // The firmware boots through bootplane; read its console.
    wait_console(
        s,
        || lab.serial(s.server),
        || {
            format!(
                "--- qemu.log ---\n{}\n--- bootplane ---\n{}",
                read(&lab.path(&format!("state/qemu/{}/qemu.log", s.server))),
                tail(&lab.log(), 60)
            )
        },
    );
    lab.keep_logs(s.server);
    // Never a second VM; the Linux scenario's init ends with `poweroff -f`, so by
    // now its one VM may already have exited (CI saw 0 here once).
    let n = lab.qemu_count();
    assert!(
        n <= 1,
        "{n} qemu processes while booting (one VM per server)"
    );

    // Progress recorded on the boot configuration.
    wait_for(
        Duration::from_secs(20),
        || {
            lab.get_json("sbc", &claim).is_some_and(|v| {
                condition_true(&v, "IPXEScriptFetched")
                    && (!s.ignition || condition_true(&v, "IgnitionDataFetched"))
            })
        },
        || format!("conditions not set: {:?}", lab.get_json("sbc", &claim)),
    );

    // Unclaim: the VM stops, the server is Available again.
    let out = lab.cli(&["delete", "serverclaims", &claim], None);
    assert!(
        out.status.success(),
        "delete: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        Duration::from_secs(30),
        || {
            lab.get_json("servers", s.server).is_some_and(|v| {
                v["status"]["state"] == "Available" && v["status"]["powerState"] == "Off"
            })
        },
        || {
            format!(
                "server not released: {:?}",
                lab.get_json("servers", s.server)
            )
        },
    );
    wait_for(
        Duration::from_secs(15),
        || !lab.qemu_running(),
        || "qemu still running after the claim was deleted".into(),
    );
}

pub fn require_all() {
    require_tools(&["qemu-system-x86_64", "ip", "dpkg-deb", "apt-get"]);
    for (f, package) in [
        ("/usr/lib/ipxe/undionly.kpxe", "ipxe"),
        ("/usr/lib/ipxe/ipxe.efi", "ipxe"),
        ("/usr/lib/ipxe/qemu/pxe-e1000.rom", "ipxe-qemu"),
        ("/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf"),
        ("/usr/share/seabios/bios-256k.bin", "seabios"),
    ] {
        require_file(f, package);
    }
}

// ---- the Linux pieces: a real kernel and an initramfs built here ---------------------

/// Debian's kernel package, downloaded once with apt and unpacked under target/.
pub fn debian_kernel() -> (PathBuf, PathBuf) {
    // Downloaded and unpacked under a file lock: tests in other threads or processes
    // (`cargo nextest run`) may want it at the same time.
    let _lock = super::data::cache_lock("e2e-firmware-kernel");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-firmware");
    std::fs::create_dir_all(&cache).unwrap();
    let find_deb = || {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with("linux-image-") && n.ends_with("_amd64.deb")
            })
    };
    let deb = match find_deb() {
        Some(d) => d,
        None => {
            // linux-image-amd64 depends on the versioned package that holds the kernel.
            let deps = must("apt-cache", &["depends", "linux-image-amd64"]);
            let pkg = deps
                .lines()
                .find_map(|l| l.trim().strip_prefix("Depends: "))
                .map(|s| s.trim().to_string())
                .expect("apt-cache depends linux-image-amd64 names the kernel package");
            let mut c = Command::new("apt-get");
            c.args(["download", &pkg]).current_dir(&cache);
            let out = run_bounded(c, 300);
            assert!(
                out.status.success(),
                "apt-get download {pkg}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            find_deb().expect("downloaded kernel package")
        }
    };
    let root = cache.join("kernel-root");
    if !root.join("boot").exists() {
        let tmp = cache.join("kernel-root.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        must(
            "dpkg-deb",
            &["-x", deb.to_str().unwrap(), tmp.to_str().unwrap()],
        );
        std::fs::rename(&tmp, &root).unwrap();
    }
    let vmlinuz = std::fs::read_dir(root.join("boot"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .expect("vmlinuz in the kernel package");
    let e1000 =
        find_file(&root.join("lib/modules"), "e1000.ko").expect("e1000.ko in the kernel package");
    (vmlinuz, e1000)
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

/// A newc cpio archive writer (the initramfs format), enough for files, dirs, symlinks.
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Cpio {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }
    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }
    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, data);
    }
    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// Shared libraries a binary needs (per ldd), as absolute paths.
fn libs_of(bin: &str) -> Vec<String> {
    let out = must("ldd", &[bin]);
    out.lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, r)) => r.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| p.to_string())
        })
        .collect()
}

pub const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

/// An initramfs: busybox, e1000.ko and the real ignition client. Its /init brings the
/// NIC up with DHCP, runs `ignition -platform metal -stage fetch` (which reads
/// ignition.config.url from /proc/cmdline) and prints the fetched config.
pub fn initramfs(e1000: &Path) -> Vec<u8> {
    let mut c = Cpio::new();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "run",
        "tmp",
        "etc",
        "lib",
        "lib64",
        "usr",
        "usr/lib",
        "usr/share",
        "usr/share/udhcpc",
        "sysroot",
    ] {
        c.dir(d);
    }
    let busybox = if Path::new("/bin/busybox").exists() {
        "/bin/busybox"
    } else {
        "/usr/bin/busybox"
    };
    c.file("bin/busybox", 0o755, &std::fs::read(busybox).unwrap());
    c.file("bin/ignition", 0o755, &std::fs::read(IGNITION).unwrap());
    let mut libs = libs_of(busybox);
    libs.extend(libs_of(IGNITION));
    libs.sort();
    libs.dedup();
    let mut dirs = std::collections::BTreeSet::new();
    for l in &libs {
        // Keep the path the loader expects (/lib64/ld-linux..., /lib/x86_64-linux-gnu/...).
        let rel = l.trim_start_matches('/');
        let mut acc = String::new();
        for part in Path::new(rel).parent().unwrap().components() {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(&part.as_os_str().to_string_lossy());
            if dirs.insert(acc.clone())
                && !["lib", "lib64", "usr", "usr/lib"].contains(&acc.as_str())
            {
                c.dir(&acc);
            }
        }
        let real = std::fs::canonicalize(l).unwrap();
        c.file(rel, 0o755, &std::fs::read(real).unwrap());
    }
    c.file("e1000.ko", 0o644, &std::fs::read(e1000).unwrap());
    c.file(
        "usr/share/udhcpc/default.script",
        0o755,
        b"#!/bin/sh\ncase \"$1\" in\n bound|renew) ip addr add $ip/${mask:-24} dev $interface; [ -n \"$router\" ] && ip route add default via ${router%% *} ;;\nesac\nexit 0\n",
    );
    let init = "#!/bin/busybox sh\n\
        /bin/busybox --install -s /bin\n\
        export PATH=/bin\n\
        mount -t proc proc /proc\n\
        mount -t sysfs sys /sys\n\
        mount -t devtmpfs dev /dev\n\
        mount -t tmpfs run /run\n\
        echo bootplane-e2e: linux init running\n\
        insmod /e1000.ko\n\
        ip link set lo up\n\
        ip link set eth0 up\n\
        udhcpc -i eth0 -n -q -t 20 -T 2 -s /usr/share/udhcpc/default.script\n\
        ip -4 addr show eth0\n\
        for a in $(cat /proc/cmdline); do case $a in ignition.config.url=*) echo \"bootplane-e2e: url ${a#ignition.config.url=}\" ;; esac; done\n\
        if /bin/ignition -platform metal -stage fetch -root /sysroot -log-to-stdout 2>&1; then echo bootplane-e2e: ignition fetch ok; else echo bootplane-e2e: ignition fetch failed; fi\n\
        echo \"bootplane-e2e: config $(cat /run/ignition.json)\"\n\
        echo bootplane-e2e: done\n\
        poweroff -f\n";
    c.file("init", 0o755, init.as_bytes());
    c.finish()
}
