//! End to end over Redfish: a real VM, powered and pointed at the network by
//! sushy-emulator's libvirt driver, boots through bootplane alone.
//!
//! Each test builds one network namespace with a bridge `br0` (10.199.NET.1/24) and runs
//! inside it: a private libvirt daemon (tests/support/libvirt.rs), sushy-emulator
//! (sushy-tools 2.2.0, libvirt driver, HTTP basic auth) on 10.199.NET.1:8000, and
//! `bootplane serve` with authoritative DHCP, TFTP and the boot HTTP listener. The VM is
//! a libvirt domain of type `qemu` (TCG; console on COM1 to a file; one virtio NIC on
//! `br0`; no disk). The per-machine iPXE template also fetches the machine's Ignition
//! with iPXE (the test image's "kernel" is an iPXE script, not Linux).
//!
//! **The real flow** (`driver_*`): the test applies a BMCSecret, a BMC (`RedfishLocal`,
//! sushy), a Server with `spec.bmcRef`, the VM's UUID and MAC and the annotation
//! `bootplane.dev/boot-mode`, an Ignition Secret and a ServerClaim with `power: On`.
//! bootplane's `redfish` driver sets the one-time boot and sends Reset On; the VM boots
//! through bootplane; the boot configuration's IPXEScriptFetched and IgnitionDataFetched
//! conditions and the Server's PowerReady and BootOverride (True, `Set`) are checked;
//! deleting the claim makes bootplane power it off through sushy (GracefulShutdown, which
//! iPXE ignores, then ForceOff after `shutdown_timeout_secs`): domain "shut off",
//! Redfish PowerState Off, Server Available/Off.
//!
//! - `driver_pxe_once`: PATCH `Boot {Pxe, Once}` → sushy writes `<boot order='1'/>` on
//!   the domain's interface → SeaBIOS runs the NIC's iPXE ROM → bootplane's DHCP →
//!   `boot.ipxe` → the machine's script → Ignition → kernel, initrd;
//! - `driver_virtual_media_cd`: InsertMedia of the machine's signed ISO
//!   (`/ipxe/boot.iso?server=…`) → sushy downloads it (to its TMPDIR), uploads it as a
//!   volume of the daemon's `default` pool and attaches it as an IDE cdrom; `Boot {Cd,
//!   Once}` gives the cdrom boot order 1 → SeaBIOS boots the CD (ISOLINUX → iPXE) → its
//!   script runs `dhcp` and chains the machine's signed script directly (no
//!   `boot.ipxe`) → … ; bootplane ejects the media once the script was fetched (the
//!   cdrom is gone from the domain, the Redfish media shows Inserted false);
//! - `driver_uefi_http_boot_uri`: PATCH `Boot {UefiHttp, Once, HttpBootUri = the
//!   machine's signed ISO}` on an OVMF domain (sushy offers `UefiHttp` only to domains
//!   with a `pflash` loader) → sushy-tools 2.2.0 downloads the URI as an ISO, attaches it
//!   as a cdrom and sets the boot device to Cd (it has no real HTTP boot) → OVMF boots
//!   the ISO's UEFI entry (`ipxe.efi`, which cannot read the ISO's script) → iPXE
//!   autoboots through bootplane's DHCP → `boot.ipxe` → the machine's script → … .
//!
//! What sushy shows of each mode is checked on the way (the Redfish boot target, the
//! media's image, boot mode UEFI and the HttpBootUri), so each firmware path is booted
//! once: a VM boot is tens of seconds of the suite's longest chain under TCG. (Tests
//! that sent the same Redfish calls themselves, with bootplane's `test` driver and the
//! generic `/boot.iso`, booted the same paths a second time; the generic ISO's boot is
//! `boot_iso`'s.)
//!
//! sushy-tools ignores `BootSourceOverrideEnabled` (libvirt boot order is persistent and
//! its GET always says `Continuous`): the tests send `Once` as a BMC client would and
//! check only the target.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::api::condition_true;
use support::bootplane::{bootplane_cli, get_json_in, ipxe_templates, serve_in, tail};
use support::image::tiny_ipxe_image;
use support::libvirt::{require_libvirt, DomainSpec, Firmware, Libvirtd, Sushy};
use support::netns::*;
use support::process::*;
use support::require::*;

/// A per-machine script that also fetches the machine's Ignition config with iPXE (the
/// tiny test "kernel" below is an iPXE script, not Linux), then boots the image.
const MACHINE_IPXE: &str = "#!ipxe\n\
echo bootplane: booting {{ server }} with {{ image }}\n\
imgfetch --name ign {{ ignition_url }} || goto failed\n\
imgfree ign\n\
echo bootplane-e2e: ignition fetched\n\
kernel {{ kernel_url }} initrd=initrd {{ cmdline }}\n\
initrd --name initrd {{ initrd_url }}\n\
boot\n\
:failed\n\
echo bootplane-e2e: ignition fetch failed\n\
sleep 600\n";

/// The BMC's credentials (sushy-emulator's htpasswd; bootplane's BMCSecret).
const BMC_USER: &str = "bmc-admin";
const BMC_PASSWORD: &str = "sushy-e2e-password";

/// One namespace with libvirtd, sushy-emulator and bootplane. Fields drop in order:
/// bootplane, sushy, libvirt (domains destroyed and undefined), the namespace, the dir.
struct Lab {
    bp: Option<Proc>,
    sushy: Sushy,
    libvirt: Libvirtd,
    ns: Netns,
    dir: tempfile::TempDir,
    net: u8,
}

impl Lab {
    fn new(net: u8) -> Lab {
        require_libvirt();
        require_tools(&["curl"]);
        let ns = Netns::new("rf");
        ns.bridge("br0", &format!("10.199.{net}.1/24"));
        let dir = tempfile::tempdir().unwrap();
        let libvirt = Libvirtd::start(&ns, &dir.path().join("libvirt"));
        let sushy = Sushy::start(
            &ns,
            dir.path(),
            &libvirt.uri(),
            (&format!("10.199.{net}.1"), 8000),
            Some((BMC_USER, BMC_PASSWORD)),
        );
        let mut lab = Lab {
            bp: None,
            sushy,
            libvirt,
            ns,
            dir,
            net,
        };
        lab.start_bootplane();
        lab
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn ip(&self) -> String {
        format!("10.199.{}.1", self.net)
    }

    fn log(&self) -> String {
        read(&self.path("bootplane.log"))
    }

    /// bootplane with DHCP (authoritative), TFTP, HTTP, the `test` power driver for
    /// Servers without a BMC and `[power.redfish]` (short polls and timeouts) for the rest.
    fn start_bootplane(&mut self) {
        let assets = self.path("assets");
        std::fs::create_dir_all(&assets).unwrap();
        for f in ["undionly.kpxe", "ipxe.efi"] {
            std::fs::copy(Path::new("/usr/lib/ipxe").join(f), assets.join(f))
                .unwrap_or_else(|e| panic!("/usr/lib/ipxe/{f} (apt-get install ipxe): {e}"));
        }
        let images = self.path("images");
        tiny_ipxe_image(&images, "bootplane-e2e: kernel image running");
        let templates = ipxe_templates(self.dir.path(), &[("machine.ipxe.j2", MACHINE_IPXE)]);
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
range = "10.199.{net}.100-10.199.{net}.150"
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
power_driver = "test"
[power.redfish]
poll_interval_secs = 2
shutdown_timeout_secs = 2
power_wait_secs = 60
retry_max_secs = 5
timeout_secs = 60
"#,
            state = self.path("state").display(),
            ip = self.ip(),
            net = self.net,
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

    fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.ns, &self.path("state"), args, stdin)
    }

    fn get_json(&self, kind: &str, name: &str) -> Option<Value> {
        get_json_in(&self.ns, &self.path("state"), kind, name)
    }

    /// One Redfish call to sushy (from a thread inside the namespace): status and body.
    fn redfish(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.sushy.base);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        self.ns.run(move || {
            let c = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap();
            let mut r = c
                .request(method, &url)
                .basic_auth(BMC_USER, Some(BMC_PASSWORD));
            if let Some(b) = body {
                r = r.json(&b);
            }
            let resp = r.send().unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = resp.status().as_u16();
            let text = resp.text().unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        })
    }

    /// A Redfish call that must answer 2xx.
    fn redfish_ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (st, v) = self.redfish(method, path, body.clone());
        assert!(
            (200..300).contains(&st),
            "{method} {path} {body:?}: {st} {v}\n--- sushy ---\n{}",
            tail(&self.sushy.log(), 40)
        );
        v
    }

    fn serial(&self, vm: &Vm) -> String {
        strip_ansi(&String::from_utf8_lossy(
            &std::fs::read(&vm.serial).unwrap_or_default(),
        ))
    }

    /// Keep the console, bootplane's, sushy's and libvirt's logs under target/.
    fn keep_logs(&self, vm: &Vm) {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-redfish/logs");
        let _ = std::fs::create_dir_all(&d);
        let n = &vm.name;
        let _ = std::fs::write(d.join(format!("{n}.serial.log")), self.serial(vm));
        let _ = std::fs::write(d.join(format!("{n}.bootplane.log")), self.log());
        let _ = std::fs::write(d.join(format!("{n}.sushy.log")), self.sushy.log());
        let _ = std::fs::write(d.join(format!("{n}.qemu.log")), self.libvirt.qemu_log(n));
    }
}

/// The claimed VM of one test.
struct Vm {
    name: String,
    uuid: String,
    serial: PathBuf,
}

impl Vm {
    fn system(&self) -> String {
        format!("/redfish/v1/Systems/{}", self.uuid)
    }
    fn claim(&self) -> String {
        format!("{}-claim", self.name)
    }
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

/// The console from `boot.ipxe` (the generic chain script) to the machine's script.
fn identify_lines(lab: &Lab) -> Vec<String> {
    vec![
        format!("http://{}:8080/boot.ipxe... ok", lab.ip()),
        "bootplane: identifying ".into(),
    ]
}

/// The console from the machine's own script on: Ignition, kernel and initrd fetched.
fn script_lines(lab: &Lab, vm: &Vm) -> Vec<String> {
    vec![
        format!("http://{}:8080/ipxe/script", lab.ip()),
        format!("bootplane: booting {}", vm.name),
        "bootplane-e2e: ignition fetched".into(),
        "/assets/images/os/kernel... ok".into(),
        "/assets/images/os/initrd... ok".into(),
        "bootplane-e2e: kernel image running".into(),
    ]
}

/// A network boot by the NIC's iPXE ROM under SeaBIOS, through bootplane's DHCP.
fn pxe_lines(lab: &Lab, vm: &Vm) -> Vec<String> {
    let mut l = vec![
        "iPXE (PCI 00:02.0) starting execution".to_string(),
        format!("Filename: http://{}:8080/boot.ipxe", lab.ip()),
    ];
    l.extend(identify_lines(lab));
    l.extend(script_lines(lab, vm));
    l
}

/// OVMF boots the ISO's UEFI entry (`ipxe.efi`), which cannot read the ISO's script:
/// iPXE autoboots through bootplane's DHCP to `boot.ipxe` (docs/http-boot.md).
fn uefi_cd_lines(lab: &Lab, vm: &Vm) -> Vec<String> {
    let mut l = vec![
        "BdsDxe: loading Boot0001 \"UEFI QEMU DVD-ROM".to_string(),
        "iPXE initialising devices".to_string(),
        format!("Filename: http://{}:8080/boot.ipxe", lab.ip()),
    ];
    l.extend(identify_lines(lab));
    l.extend(script_lines(lab, vm));
    l
}

/// SeaBIOS boots the machine's own ISO (ISOLINUX → iPXE), whose script chains the
/// machine's signed script directly (no `boot.ipxe`).
fn bios_cd_lines(lab: &Lab, vm: &Vm) -> Vec<String> {
    let mut l = vec![
        "Booting from DVD/CD".to_string(),
        "iPXE initialising devices".to_string(),
    ];
    l.extend(script_lines(lab, vm));
    l
}

/// The cdrom sushy attached: its source file (a volume in the `default` pool) and
/// whether it has boot order 1.
fn cdrom_of(lab: &Lab, vm: &Vm) -> Option<(String, bool)> {
    let xml = lab.libvirt.inactive_xml(&vm.name);
    let start = xml.find("<disk type='file' device='cdrom'>")?;
    let disk = &xml[start..start + xml[start..].find("</disk>")?];
    let src = disk.split("<source file='").nth(1)?.split('\'').next()?;
    Some((src.to_string(), disk.contains("<boot order='1'/>")))
}

// ---- the real flow: bootplane's `redfish` power driver drives sushy -------------------

/// Define the domain, then apply a BMCSecret + BMC (sushy, `RedfishLocal` on port 8000),
/// a Server with `spec.bmcRef`, the VM's UUID and MAC and the boot-mode annotation, an
/// Ignition Secret and a ServerClaim with `power: On`: bootplane itself powers it on.
fn bmc_claimed_vm(lab: &Lab, name: &str, last: u8, mode: &str, firmware: Firmware) -> Vm {
    let mac = format!("52:54:00:e2:{:02x}:{last:02x}", lab.net);
    let uuid = format!("4c4c4544-00e2-00e2-00{:02x}-0000000000{last:02x}", lab.net);
    let serial = lab.path(&format!("{name}.serial.log"));
    lab.libvirt.define(&DomainSpec {
        name,
        firmware,
        uuid: &uuid,
        mac: &mac,
        bridge: "br0",
        memory_mib: 256,
        serial_log: &serial,
    });
    let ign = format!(
        r#"{{"ignition":{{"version":"3.3.0"}},"storage":{{"files":[{{"path":"/etc/e2e-marker","contents":{{"source":"data:,hello-from-{name}"}}}}]}}}}"#
    );
    let yaml = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMCSecret\nmetadata: {{name: {name}-bmc}}\n\
         stringData: {{username: {BMC_USER}, password: {BMC_PASSWORD}}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMC\nmetadata: {{name: {name}-bmc}}\n\
         spec: {{access: {{ip: \"{ip}\"}}, bmcSecretRef: {{name: {name}-bmc}}, protocol: {{name: RedfishLocal, port: 8000}}}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\n\
         metadata: {{name: {name}, annotations: {{bootplane.dev/boot-mode: {mode}}}}}\n\
         spec: {{systemUUID: {uuid}, bmcRef: {{name: {name}-bmc}}}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"{mac}\"}}]}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-ign, namespace: default}}\nstringData: {{ignition: '{ign}'}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: {name}-claim, namespace: default}}\n\
         spec: {{power: \"On\", image: \"os-image:latest\", serverRef: {{name: {name}}}, ignitionSecretRef: {{name: {name}-ign}}}}\n",
        ip = lab.ip(),
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
    assert!(out.status.success(), "apply: {}", text(&out));
    Vm {
        name: name.to_string(),
        uuid,
        serial,
    }
}

/// The Server's condition `ty`: (status, reason).
fn server_condition(lab: &Lab, name: &str, ty: &str) -> Option<(String, String)> {
    let v = lab.get_json("servers", name)?;
    let c = v
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
    ))
}

/// bootplane powers the VM on through sushy (domain running, powerState On, PowerReady
/// and BootOverride True), the console shows `serial`, the boot configuration records the
/// script and Ignition fetches; `booted` checks what the mode left on the domain; then the
/// claim is deleted and bootplane powers the VM off through sushy.
fn driver_boot_and_release(lab: &Lab, vm: &Vm, serial: &[&str], booted: impl Fn(&Lab, &Vm)) {
    let t0 = Instant::now();
    wait_for(
        Duration::from_secs(90),
        || {
            lab.get_json("servers", &vm.name)
                .is_some_and(|v| v["status"]["powerState"] == "On")
        },
        || {
            format!(
                "bootplane did not power {} on: {}\n--- sushy ---\n{}\n--- bootplane ---\n{}",
                vm.name,
                lab.get_json("servers", &vm.name)
                    .map(|v| v["status"].clone())
                    .unwrap_or_default(),
                tail(&lab.sushy.log(), 30),
                tail(&lab.log(), 60)
            )
        },
    );
    assert_eq!(lab.libvirt.state(&vm.name), "running");
    assert_eq!(
        server_condition(lab, &vm.name, "BootOverride"),
        Some(("True".into(), "Set".into())),
        "{:?}",
        lab.get_json("servers", &vm.name)
    );
    assert_eq!(
        server_condition(lab, &vm.name, "PowerReady").map(|c| c.0),
        Some("True".into())
    );
    wait_console(lab, vm, serial, Duration::from_secs(150));
    eprintln!("{}: claimed to booted in {:.1?}", vm.name, t0.elapsed());
    wait_for(
        Duration::from_secs(20),
        || {
            lab.get_json("sbc", &vm.claim()).is_some_and(|v| {
                condition_true(&v, "IPXEScriptFetched") && condition_true(&v, "IgnitionDataFetched")
            })
        },
        || format!("conditions not set: {:?}", lab.get_json("sbc", &vm.claim())),
    );
    booted(lab, vm);

    let out = lab.cli(&["delete", "serverclaims", &vm.claim()], None);
    assert!(out.status.success(), "delete: {}", text(&out));
    wait_for(
        Duration::from_secs(60),
        || {
            lab.get_json("servers", &vm.name).is_some_and(|v| {
                v["status"]["state"] == "Available" && v["status"]["powerState"] == "Off"
            })
        },
        || {
            format!(
                "server not released and off: {:?}\n{}",
                lab.get_json("servers", &vm.name),
                tail(&lab.log(), 40)
            )
        },
    );
    assert_eq!(lab.libvirt.state(&vm.name), "shut off");
    let sys = lab.redfish_ok("GET", &vm.system(), None);
    assert_eq!(sys["PowerState"], "Off", "{sys}");
    // Reset On, then GracefulShutdown (ignored by iPXE) and ForceOff: all from bootplane.
    let resets = lab
        .sushy
        .log()
        .lines()
        .filter(|l| l.contains("/Actions/ComputerSystem.Reset HTTP/") && l.ends_with(" 204 -"))
        .count();
    assert!(
        resets >= 3,
        "{resets} resets in sushy's log (On, GracefulShutdown, ForceOff)"
    );
    lab.keep_logs(vm);
    assert!(
        !lab.log().contains(BMC_PASSWORD),
        "the BMC password is in bootplane's log"
    );
}

/// Poll the console until `serial` shows in order (panics with all logs after `limit`).
fn wait_console(lab: &Lab, vm: &Vm, serial: &[&str], limit: Duration) {
    let t0 = Instant::now();
    loop {
        let console = lab.serial(vm);
        if in_order(&console, serial).is_ok() {
            lab.keep_logs(vm);
            return;
        }
        if t0.elapsed() > limit {
            lab.keep_logs(vm);
            panic!(
                "{}: console never showed {:?} within {limit:?}\n--- serial ---\n{console}\n\
                 --- qemu ---\n{}\n--- sushy ---\n{}\n--- bootplane ---\n{}",
                vm.name,
                in_order(&console, serial).unwrap_err(),
                tail(&lab.libvirt.qemu_log(&vm.name), 20),
                tail(&lab.sushy.log(), 20),
                tail(&lab.log(), 60)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Poll the domain's definition until a cdrom is on it with boot order 1 (sushy writes
/// the cdrom and then its boot order as two definitions, so one read can land between
/// them), within a minute: the cdrom's source file.
fn cdrom_first(lab: &Lab, vm: &Vm) -> String {
    let seen = std::cell::RefCell::new(None);
    wait_for(
        Duration::from_secs(60),
        || {
            let now = cdrom_of(lab, vm);
            let done = matches!(now, Some((_, true)));
            *seen.borrow_mut() = now;
            done
        },
        || {
            format!(
                "no cdrom first in the boot order (last seen: {:?}): {:?}\n\
                 --- sushy ---\n{}\n--- bootplane ---\n{}",
                seen.borrow(),
                lab.get_json("servers", &vm.name),
                tail(&lab.sushy.log(), 10),
                tail(&lab.log(), 30)
            )
        },
    );
    seen.into_inner().expect("the cdrom seen above").0
}

/// Whether `path` is an ISO 9660 image (the primary volume descriptor at 32 KiB).
fn is_iso(path: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| b.len() > 0x8006 && &b[0x8001..0x8006] == b"CD001")
}

#[test]
fn driver_pxe_once() {
    let lab = Lab::new(74);
    let vm = bmc_claimed_vm(&lab, "rfd-pxe", 4, "Pxe", Firmware::SeaBios);
    let lines = pxe_lines(&lab, &vm);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    driver_boot_and_release(&lab, &vm, &lines, |lab, vm| {
        let sys = lab.redfish_ok("GET", &vm.system(), None);
        assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Pxe", "{sys}");
        let xml = lab.libvirt.inactive_xml(&vm.name);
        let nic = &xml[xml.find("<interface").unwrap()..xml.find("</interface>").unwrap()];
        assert!(
            nic.contains("<boot order='1'/>"),
            "no NIC boot order from sushy: {xml}"
        );
        let console = lab.serial(vm);
        assert!(!console.contains("Booting from DVD/CD"), "{console}");
    });
}

#[test]
fn driver_virtual_media_cd() {
    let lab = Lab::new(75);
    let vm = bmc_claimed_vm(&lab, "rfd-vmedia", 5, "VirtualMedia", Firmware::SeaBios);
    let lines = bios_cd_lines(&lab, &vm);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    // The driver inserts the machine's ISO and puts the cdrom first before it powers the
    // machine on; sushy uploaded it as a volume of the daemon's pool. (The eject comes
    // once the script was fetched, tens of seconds into the boot under TCG.)
    let media = format!("{}/VirtualMedia/Cd", vm.system());
    let src = cdrom_first(&lab, &vm);
    assert!(
        src.starts_with(lab.path("libvirt/pool").to_str().unwrap()),
        "{src}"
    );
    assert!(is_iso(&src), "the uploaded volume is not an ISO image");
    let m = lab.redfish_ok("GET", &media, None);
    let image = m["Image"].as_str().unwrap_or_default();
    assert!(
        image.starts_with(&format!(
            "http://{}:8080/ipxe/boot.iso?server=rfd-vmedia&",
            lab.ip()
        )),
        "the media is not the machine's ISO: {m}"
    );
    driver_boot_and_release(&lab, &vm, &lines, |lab, vm| {
        // bootplane ejects the media once the machine fetched its script.
        wait_for(
            Duration::from_secs(30),
            || cdrom_of(lab, vm).is_none(),
            || format!("media not ejected: {:?}", cdrom_of(lab, vm)),
        );
        let m = lab.redfish_ok("GET", &format!("{}/VirtualMedia/Cd", vm.system()), None);
        assert_eq!(m["Inserted"], false, "{m}");
    });
}

#[test]
fn driver_uefi_http_boot_uri() {
    let lab = Lab::new(76);
    let vm = bmc_claimed_vm(&lab, "rfd-http", 6, "UefiHttp", Firmware::Ovmf);
    let lines = uefi_cd_lines(&lab, &vm);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    // sushy-tools downloads HttpBootUri, attaches it as a cdrom (one domain definition)
    // and then puts that cdrom first in the boot order (the next definition), while the
    // driver's PATCH is still being answered: poll the definition until it shows both,
    // with a deadline. One read as soon as the cdrom appeared could land between the
    // two writes and see the cdrom without the boot order (a clean-clone CI run did).
    let src = cdrom_first(&lab, &vm);
    assert!(
        is_iso(&src),
        "HttpBootUri's content is not an ISO image: {src}"
    );
    let sys = lab.redfish_ok("GET", &vm.system(), None);
    assert_eq!(sys["Boot"]["BootSourceOverrideMode"], "UEFI", "{sys}");
    // sushy-tools 2.2.0: the URI is downloaded as an ISO and booted as a CD.
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Cd", "{sys}");
    let uri = sys["Boot"]["HttpBootUri"].as_str().unwrap_or_default();
    assert!(
        uri.starts_with(&format!(
            "http://{}:8080/ipxe/boot.iso?server=rfd-http&",
            lab.ip()
        )),
        "HttpBootUri is not the machine's ISO: {sys}"
    );
    driver_boot_and_release(&lab, &vm, &lines, |_, _| {});
}
