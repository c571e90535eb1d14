//! End to end with real firmware: a claimed VM boots through bootplane alone.
//!
//! Each scenario builds a network namespace with a bridge (unique names, removed by Drop
//! even on failure) and runs `bootplane serve` inside it with authoritative DHCP, TFTP,
//! the boot HTTP listener and the `qemu` power driver (taps on that bridge). Nothing else
//! is in the path. The test registers a Server with a MAC, applies an Ignition Secret and
//! a ServerClaim with `power: On`, and then reads the VM's serial console:
//!
//! - `bios_ipxe_rom_boots_linux_and_fetches_ignition`: SeaBIOS + QEMU's iPXE ROM → DHCP →
//!   per-machine script over HTTP → a real Debian kernel + an initramfs built here
//!   (busybox, e1000.ko, the real `ignition` binary) → `ignition -platform metal -stage
//!   fetch` reads `ignition.config.url` from /proc/cmdline and the config is printed on
//!   the serial console;
//! - `bios_tftp_undionly_chain`: firmware → `undionly.kpxe` over TFTP → chained iPXE → script;
//! - `uefi_pxe_ipxe_efi_over_tftp`: OVMF's own PXE (NIC ROM removed) → `ipxe.efi` over TFTP;
//! - `uefi_http_boot_ipxe_efi_over_http`: OVMF native HTTP Boot → `ipxe.efi` over HTTP.
//!
//! Every scenario also checks the boot configuration's IPXEScriptFetched condition, and that
//! deleting the claim stops the VM and returns the server to Available.
//!
//! QEMU's NIC ROM is itself iPXE, and so is a chained `undionly.kpxe`: they send the same
//! DHCP options, so DHCP cannot tell them apart. The TFTP scenario therefore uses a
//! `boot.ipxe` template (templates are the operator's to edit) that chains `undionly.kpxe`
//! from TFTP unless it already runs on the UNDI driver: the loop is broken by the HTTP
//! script, as it must be on such firmware.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::api::condition_true;
use support::bootplane::{bootplane_cli, get_json_in, ipxe_templates, serve_in};
use support::image::{tiny_ipxe_image, write_catalog};
use support::netns::*;
use support::process::*;
use support::require::*;

/// One namespace with a bridge `br0` (10.199.NET.1/24) and bootplane inside.
struct QemuLab {
    ns: Netns,
    dir: tempfile::TempDir,
    net: u8,
    bp: Option<Proc>,
}

impl QemuLab {
    fn new(net: u8) -> QemuLab {
        let ns = Netns::new("q");
        ns.bridge("br0", &format!("10.199.{net}.1/24"));
        QemuLab {
            ns,
            dir: tempfile::tempdir().unwrap(),
            net,
            bp: None,
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn addr(&self, last: u8) -> String {
        format!("10.199.{}.{last}", self.net)
    }

    fn log(&self) -> String {
        read(&self.path("bootplane.log"))
    }

    /// Start bootplane with DHCP (authoritative), TFTP, HTTP and the qemu driver.
    fn start(&mut self, images: &Path, templates: &Path) {
        let assets = self.path("assets");
        std::fs::create_dir_all(&assets).unwrap();
        for f in ["undionly.kpxe", "ipxe.efi"] {
            std::fs::copy(Path::new("/usr/lib/ipxe").join(f), assets.join(f))
                .unwrap_or_else(|e| panic!("/usr/lib/ipxe/{f} (apt-get install ipxe): {e}"));
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cfg = format!(
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
        );
        std::fs::write(self.path("bootplane.toml"), cfg).unwrap();
        self.bp = Some(serve_in(
            &self.ns,
            &self.path("bootplane.toml"),
            &self.path("bootplane.log"),
        ));
    }

    /// The bootplane CLI against this instance's API (inside the namespace).
    fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.ns, &self.path("state"), args, stdin)
    }

    fn get_json(&self, kind: &str, name: &str) -> Option<Value> {
        get_json_in(&self.ns, &self.path("state"), kind, name)
    }

    /// The VM's serial console as text (ANSI escape sequences removed).
    fn serial(&self, server: &str) -> String {
        let raw = std::fs::read(self.path(&format!("state/qemu/{server}/serial.log")))
            .unwrap_or_default();
        strip_ansi(&String::from_utf8_lossy(&raw))
    }

    /// How many qemu processes run in the namespace.
    fn qemu_count(&self) -> usize {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.starts_with("qemu"))
                    .unwrap_or(false)
            })
            .count()
    }

    fn qemu_running(&self) -> bool {
        self.qemu_count() > 0
    }

    /// Keep the console and bootplane's log under target/ for reading after the run.
    fn keep_logs(&self, server: &str) {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-firmware/logs");
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(d.join(format!("{server}.serial.log")), self.serial(server));
        let _ = std::fs::write(d.join(format!("{server}.bootplane.log")), self.log());
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

/// A small image whose "kernel" is an iPXE script: iPXE fetches kernel and initrd over
/// HTTP and runs it, which prints a marker (proof that both were fetched and booted).
/// A started lab on 10.199.`net`.0/24 serving the tiny test image with the default
/// templates (the tools checked first).
fn tiny_lab(net: u8) -> QemuLab {
    require_all();
    let mut lab = QemuLab::new(net);
    let images = lab.path("images");
    tiny_ipxe_image(&images, "bootplane-e2e: kernel image running");
    let t = ipxe_templates(lab.dir.path(), &[]);
    lab.start(&images, &t);
    lab
}

/// What one scenario does and expects.
struct Scenario<'a> {
    server: &'a str,
    mac_last: u8,
    firmware: &'a str,
    /// Serial console lines that must all appear, in this order.
    serial: &'a [&'a str],
    boot_limit: Duration,
    /// Also wait for IgnitionDataFetched.
    ignition: bool,
}

fn in_order(hay: &str, needles: &[&str]) -> Result<(), String> {
    let mut pos = 0;
    for n in needles {
        match hay[pos..].find(n) {
            Some(i) => pos += i + n.len(),
            None => return Err(n.to_string()),
        }
    }
    Ok(())
}

/// Claim → boot → checks → unclaim, on a started lab.
fn run(lab: &QemuLab, s: &Scenario) {
    let mac = format!("52:54:00:e2:{:02x}:{:02x}", lab.net, s.mac_last);
    let ign = format!(
        r#"{{"ignition":{{"version":"3.3.0"}},"storage":{{"files":[{{"path":"/etc/e2e-marker","contents":{{"source":"data:,hello-from-{}"}}}}]}}}}"#,
        s.server
    );
    let yaml = format!(
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
    );
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
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let serial = lab.serial(s.server);
        if in_order(&serial, s.serial).is_ok() {
            break;
        }
        last = serial;
        if t0.elapsed() > s.boot_limit {
            panic!(
                "{}: console never showed {:?} within {:?}\n--- serial ---\n{}\n--- qemu.log ---\n{}\n--- bootplane ---\n{}",
                s.server,
                in_order(&last, s.serial).unwrap_err(),
                s.boot_limit,
                last,
                read(&lab.path(&format!("state/qemu/{}/qemu.log", s.server))),
                tail(&lab.log(), 60)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "{}: booted to the expected console output in {:.1?}",
        s.server,
        t0.elapsed()
    );
    lab.keep_logs(s.server);
    // Never a second VM; the Linux scenario's init ends with `poweroff -f`, so by
    // now its one VM may already have exited (CI saw 0 here once).
    let n = lab.qemu_count();
    assert!(
        n <= 1,
        "{n} qemu processes while booting (one VM per server)"
    );
    let _ = last;

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

fn require_all() {
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

#[test]
fn bios_tftp_undionly_chain() {
    require_all();
    let mut lab = QemuLab::new(61);
    let images = lab.path("images");
    tiny_ipxe_image(&images, "bootplane-e2e: kernel image running");
    // The ROM's iPXE chains undionly.kpxe from TFTP; iPXE running on the UNDI driver
    // (the chained one) goes on to the machine's script.
    let boot = "#!ipxe\n\
        echo bootplane-e2e: driver ${net0/chip}\n\
        iseq ${net0/chip} undionly && goto script ||\n\
        chain tftp://${next-server}/undionly.kpxe || goto failed\n\
        :script\n\
        echo bootplane: identifying ${net0/mac:hexhyp} (${uuid})\n\
        chain --autofree --replace {{ base_url }}/ipxe/script?uuid=${uuid}&mac=${net0/mac:hexhyp} || goto failed\n\
        :failed\n\
        echo bootplane: could not fetch this machine's script\n\
        exit 1\n";
    let t = ipxe_templates(lab.dir.path(), &[("boot.ipxe.j2", boot)]);
    lab.start(&images, &t);
    run(
        &lab,
        &Scenario {
            server: "bios-tftp",
            mac_last: 2,
            firmware: "bios",
            serial: &[
                "using 82540em",
                "Filename: http://10.199.61.1:8080/boot.ipxe",
                "bootplane-e2e: driver 82540em",
                "tftp://10.199.61.1/undionly.kpxe",
                "PXE->EB",
                "using undionly",
                "bootplane-e2e: driver undionly",
                "bootplane: identifying 52-54-00-e2-3d-02 (",
                "-00e2-000000000002)",
                "http://10.199.61.1:8080/ipxe/script... ok",
                "bootplane: booting bios-tftp",
                "/assets/images/os/kernel... ok",
                "/assets/images/os/initrd... ok",
                "bootplane-e2e: kernel image running",
            ],
            boot_limit: Duration::from_secs(120),
            ignition: false,
        },
    );
}

#[test]
fn uefi_pxe_ipxe_efi_over_tftp() {
    let lab = tiny_lab(62);
    run(
        &lab,
        &Scenario {
            server: "uefi-pxe",
            mac_last: 3,
            firmware: "uefi",
            serial: &[
                ">>Start PXE over IPv4",
                "Station IP address is 10.199.62.1",
                "NBP filename is ipxe.efi",
                "NBP file downloaded successfully",
                "iPXE",
                "using SNP",
                "Filename: http://10.199.62.1:8080/boot.ipxe",
                "bootplane: identifying 52-54-00-e2-3e-03 (",
                "-00e2-000000000003)",
                "http://10.199.62.1:8080/ipxe/script... ok",
                "bootplane: booting uefi-pxe",
                "/assets/images/os/kernel... ok",
                "/assets/images/os/initrd... ok",
                "bootplane-e2e: kernel image running",
            ],
            boot_limit: Duration::from_secs(180),
            ignition: false,
        },
    );
}

#[test]
fn uefi_http_boot_ipxe_efi_over_http() {
    let lab = tiny_lab(63);
    run(
        &lab,
        &Scenario {
            server: "uefi-http",
            mac_last: 4,
            firmware: "uefi-http",
            serial: &[
                ">>Start HTTP Boot over IPv4",
                "URI: http://10.199.63.1:8080/assets/ipxe.efi",
                "iPXE",
                "using SNP",
                "Filename: http://10.199.63.1:8080/boot.ipxe",
                "bootplane: identifying 52-54-00-e2-3f-04 (",
                "-00e2-000000000004)",
                "http://10.199.63.1:8080/ipxe/script... ok",
                "bootplane: booting uefi-http",
                "/assets/images/os/kernel... ok",
                "/assets/images/os/initrd... ok",
                "bootplane-e2e: kernel image running",
            ],
            boot_limit: Duration::from_secs(180),
            ignition: false,
        },
    );
}

// ---- the Linux scenario: a real kernel and an initramfs built here -------------------

/// Debian's kernel package, downloaded once with apt and unpacked under target/.
fn debian_kernel() -> (PathBuf, PathBuf) {
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
        while self.out.len() % 4 != 0 {
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

const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

/// An initramfs: busybox, e1000.ko and the real ignition client. Its /init brings the
/// NIC up with DHCP, runs `ignition -platform metal -stage fetch` (which reads
/// ignition.config.url from /proc/cmdline) and prints the fetched config.
fn initramfs(e1000: &Path) -> Vec<u8> {
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

#[test]
fn bios_ipxe_rom_boots_linux_and_fetches_ignition() {
    require_all();
    require("ldd");
    assert!(
        Path::new(IGNITION).exists(),
        "{IGNITION} missing (apt-get install ignition)"
    );
    let (vmlinuz, e1000) = debian_kernel();
    let mut lab = QemuLab::new(60);
    let images = lab.path("images");
    std::fs::create_dir_all(&images).unwrap();
    let rd = lab.path("initramfs.cpio");
    std::fs::write(&rd, initramfs(&e1000)).unwrap();
    let (kernel, initrd) = (
        std::fs::read(&vmlinuz).unwrap(),
        std::fs::read(&rd).unwrap(),
    );
    write_catalog(&images, "os-image:latest", &kernel, &initrd, "panic=-1");
    let t = ipxe_templates(lab.dir.path(), &[]);
    lab.start(&images, &t);
    run(
        &lab,
        &Scenario {
            server: "bios-linux",
            mac_last: 1,
            firmware: "bios",
            serial: &[
                "using 82540em",
                "Filename: http://10.199.60.1:8080/boot.ipxe",
                "bootplane: identifying 52-54-00-e2-3c-01 (",
                "-00e2-000000000001)",
                "bootplane: booting bios-linux",
                "/assets/images/os/kernel",
                "/assets/images/os/initrd",
                "Linux version",
                "bootplane-e2e: linux init running",
                "bootplane-e2e: url http://10.199.60.1:8080/",
                "bootplane-e2e: ignition fetch ok",
                "hello-from-bios-linux",
            ],
            boot_limit: Duration::from_secs(240),
            ignition: true,
        },
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn vms_die_with_bootplane() {
    let mut lab = tiny_lab(64);
    let yaml = "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\n\
        metadata: {name: orphan}\nspec: {systemUUID: 4c4c4544-00e2-00e2-00e2-000000000005}\n\
        status: {state: Available, powerState: \"Off\", networkInterfaces: [{name: eth0, macAddress: \"52:54:00:e2:40:05\"}]}\n---\n\
        apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: orphan-claim, namespace: default}\n\
        spec: {power: \"On\", image: \"os-image:latest\", serverRef: {name: orphan}}\n";
    let out = lab.cli(&["apply", "-f", "-"], Some(yaml));
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        Duration::from_secs(30),
        || lab.qemu_count() == 1,
        || format!("no VM started: {}", lab.log()),
    );
    // SIGKILL: no shutdown code runs; the kernel's parent-death signal stops the VM.
    lab.bp.as_mut().unwrap().kill9();
    wait_for(
        Duration::from_secs(10),
        || !lab.qemu_running(),
        || "qemu outlived bootplane".into(),
    );
}
