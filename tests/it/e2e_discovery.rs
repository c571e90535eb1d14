//! Discovery end to end with a real VM behind sushy-emulator's libvirt driver, through
//! bootplane alone.
//!
//! Each test builds one network namespace with a bridge `br0` (10.199.NET.1/24) and runs
//! inside it a private libvirt daemon, sushy-emulator (libvirt driver, basic auth) on
//! 10.199.NET.1:8000 and `bootplane serve` with `[discovery] enabled`, authoritative DHCP,
//! TFTP and the boot HTTP listener; the discovery image is the one
//! `scripts/make-discovery-image.sh` builds (Debian's kernel, an initramfs with the static
//! agent), cached under target/.
//!
//! - `vm_is_discovered_and_its_inventory_matches_its_configuration`: a domain with 2 NICs
//!   on `br0`, 2 SCSI disks (virtio-scsi; serial, vendor, product set), 2 vCPUs, 1 GiB and
//!   SMBIOS system facts. The test applies only a BMCSecret and a BMC for sushy; bootplane
//!   lists sushy's systems, creates the Server (UUID, NIC MACs from the BMC), moves it to
//!   `Discovery`, sets a one-time Pxe boot and powers it on through sushy; SeaBIOS → the
//!   NIC's iPXE ROM → bootplane's DHCP → `boot.ipxe` → the discovery script → Debian's
//!   kernel + the initramfs → the agent reads the machine, posts to its signed URL (the
//!   source address is its DHCP lease) → the Server's status is filled, the VM is off, the
//!   Server `Available`; every reported fact is compared with the domain's definition.
//! - `vm_whose_agent_cannot_reach_bootplane_stays_in_discovery_with_a_reason`: the same,
//!   but the VM's links are cut once its kernel and initrd are fetched, so the agent never
//!   reaches bootplane: after the report timeout (one attempt here) the Server is left in
//!   `Discovery`, powered off, condition `Discovered` False, reason `InventoryTimeout`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::bootplane::{bootplane_cli, get_json_in, serve_in};
use support::image::write_catalog;
use support::libvirt::{require_libvirt, Libvirtd, Sushy};
use support::netns::*;
use support::process::*;
use support::require::*;

const BMC_USER: &str = "bmc-admin";
const BMC_PASSWORD: &str = "sushy-discovery-pw";
const IMAGE: &str = "bootplane-discovery:latest";

/// The discovery image, built by the repository's script into the same place as
/// tests/it/discovery_image.rs builds it (downloads cached under target/), once per test
/// run (`once_per_run`, under the same name, so the two modules share one build).
fn discovery_image() -> (Vec<u8>, Vec<u8>) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join("discovery-images/bootplane-discovery");
    support::data::once_per_run("discovery-image", || {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let o = run_for(
            Command::new(repo.join("scripts/make-discovery-image.sh"))
                .arg(&out)
                .env("CACHE_DIR", tmp.join("discovery-image/cache")),
            Duration::from_secs(900),
        );
        assert!(o.status.success(), "make-discovery-image.sh: {}", text(&o));
    });
    (
        std::fs::read(out.join("vmlinuz")).unwrap(),
        std::fs::read(out.join("initramfs.img")).unwrap(),
    )
}

struct Lab {
    bp: Option<Proc>,
    _sushy: Sushy,
    libvirt: Libvirtd,
    ns: Netns,
    dir: tempfile::TempDir,
    net: u8,
}

impl Lab {
    fn new(net: u8, discovery: &str) -> Lab {
        require_libvirt();
        require_tools(&["curl"]);
        let (kernel, initrd) = discovery_image();
        let ns = Netns::new("disc");
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
            _sushy: sushy,
            libvirt,
            ns,
            dir,
            net,
        };
        let images = lab.path("images");
        write_catalog(&images, IMAGE, &kernel, &initrd, "console=ttyS0 panic=-1");
        lab.start_bootplane(&images, discovery);
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

    fn start_bootplane(&mut self, images: &Path, discovery: &str) {
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
console = "console=ttyS0"
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
ignition_templates = "{ign}"
[power.redfish]
poll_interval_secs = 2
shutdown_timeout_secs = 5
power_wait_secs = 60
retry_max_secs = 5
timeout_secs = 60
[discovery]
enabled = true
image = "{IMAGE}"
lldp_wait_secs = 2
approved_bmcs = ["{ip}"]
{discovery}
"#,
            state = self.path("state").display(),
            ip = self.ip(),
            net = self.net,
            assets = assets.display(),
            images = images.display(),
            ign = repo.join("ignition").display(),
        );
        std::fs::write(self.path("bootplane.toml"), cfg).unwrap();
        self.bp = Some(serve_in(
            &self.ns,
            &self.path("bootplane.toml"),
            &self.path("bootplane.log"),
        ));
    }

    fn apply(&self, yaml: &str) {
        let out = bootplane_cli(
            &self.ns,
            &self.path("state"),
            &["apply", "-f", "-"],
            Some(yaml),
        );
        assert!(out.status.success(), "apply: {}", text(&out));
    }

    fn get_json(&self, kind: &str, name: &str) -> Option<Value> {
        get_json_in(&self.ns, &self.path("state"), kind, name)
    }

    /// The BMC for sushy (RedfishLocal, basic auth) and its secret.
    fn add_bmc(&self) {
        self.apply(&format!(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMCSecret\nmetadata: {{name: sushy}}\n\
             stringData: {{username: {BMC_USER}, password: {BMC_PASSWORD}}}\n---\n\
             apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMC\nmetadata: {{name: sushy}}\n\
             spec: {{access: {{ip: \"{}\"}}, bmcSecretRef: {{name: sushy}}, protocol: {{name: RedfishLocal, port: 8000}}}}\n",
            self.ip()
        ));
    }

    fn serial(&self, vm: &str) -> String {
        strip_ansi(&String::from_utf8_lossy(
            &std::fs::read(self.path(&format!("{vm}.serial.log"))).unwrap_or_default(),
        ))
    }

    /// Keep the console, bootplane's and libvirt's logs under target/.
    fn keep_logs(&self, vm: &str) {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-discovery/logs");
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(d.join(format!("{vm}.serial.log")), self.serial(vm));
        let _ = std::fs::write(d.join(format!("{vm}.bootplane.log")), self.log());
        let _ = std::fs::write(d.join(format!("{vm}.qemu.log")), self.libvirt.qemu_log(vm));
    }

    /// The Server discovered for domain `uuid` (its name is `sushy-<uuid>`).
    fn server(&self, uuid: &str) -> Option<Value> {
        self.get_json("servers", &format!("sushy-{uuid}"))
    }

    fn wait_server(
        &self,
        vm: &str,
        uuid: &str,
        limit: Duration,
        what: &str,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.server(uuid) {
                if f(&s) {
                    return s;
                }
                if Instant::now() > deadline {
                    self.keep_logs(vm);
                    panic!(
                        "{what}: {s:#}\n--- console ---\n{}\n--- bootplane ---\n{}",
                        tail_lines(&self.serial(vm), 60),
                        tail_lines(&self.log(), 60)
                    );
                }
            } else if Instant::now() > deadline {
                self.keep_logs(vm);
                panic!(
                    "{what}: no Server for {uuid}\n{}",
                    tail_lines(&self.log(), 60)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The last `n` lines of `s`, without control characters (a console's escapes would
/// garble the test's report).
fn tail_lines(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..]
        .join("\n")
        .chars()
        .filter(|c| *c == '\n' || !c.is_control())
        .collect()
}

/// The domain of these tests: SeaBIOS (console on COM1), 2 virtio NICs on `br0`, 2 SCSI
/// disks with serial/vendor/product, 2 vCPUs, 1 GiB, SMBIOS system facts.
struct Machine {
    name: String,
    uuid: String,
    macs: [String; 2],
    disks: [(String, u64, &'static str, &'static str); 2],
}

fn machine(lab: &Lab, name: &str, last: u8) -> Machine {
    let n = lab.net;
    let m = Machine {
        name: name.to_string(),
        uuid: format!("4c4c4544-00d1-00d1-00{n:02x}-0000000000{last:02x}"),
        macs: [
            format!("52:54:00:d1:{n:02x}:{last:02x}"),
            format!("52:54:00:d2:{n:02x}:{last:02x}"),
        ],
        disks: [
            (format!("SER-{name}-A"), 64 << 20, "BPVENDOR", "BPDISK-A"),
            (format!("SER-{name}-B"), 96 << 20, "BPVENDOR", "BPDISK-B"),
        ],
    };
    let mut disks = String::new();
    for (k, (serial, size, vendor, product)) in m.disks.iter().enumerate() {
        let f = lab.path(&format!("{name}-disk{k}.img"));
        std::fs::File::create(&f).unwrap().set_len(*size).unwrap();
        disks.push_str(&format!(
            "<disk type='file' device='disk'>\n  <driver name='qemu' type='raw'/>\n  <source file='{}'/>\n  \
             <target dev='sd{}' bus='scsi'/>\n  <serial>{serial}</serial>\n  <vendor>{vendor}</vendor>\n  <product>{product}</product>\n  \
             <address type='drive' controller='0' bus='0' target='0' unit='{k}'/>\n</disk>\n",
            f.display(),
            (b'a' + k as u8) as char
        ));
    }
    define(lab, (name, &m.uuid), &m.macs, &disks, "");
    m
}

/// Define domain `name` (`uuid`): SeaBIOS with its console on COM1 into
/// `<name>.serial.log`, a virtio NIC on `br0` per MAC, `disks` (libvirt XML), `qemu`
/// (a `<qemu:commandline>` body for devices libvirt 9 does not model, e.g. NVMe),
/// a virtio-scsi controller, 2 vCPUs, 1 GiB, SMBIOS system facts.
fn define(lab: &Lab, (name, uuid): (&str, &str), macs: &[String], disks: &str, qemu: &str) {
    let mut nics = String::new();
    for mac in macs {
        nics.push_str(&format!(
            "<interface type='bridge'><source bridge='br0'/><mac address='{mac}'/><model type='virtio'/></interface>\n"
        ));
    }
    let serial = lab.path(&format!("{name}.serial.log"));
    let xml = format!(
        r#"<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>1024</memory>
  <vcpu>2</vcpu>
  <sysinfo type='smbios'>
    <system>
      <entry name='manufacturer'>Bootplane Labs</entry>
      <entry name='product'>E2E-Discovery</entry>
      <entry name='serial'>SYS-{name}</entry>
    </system>
  </sysinfo>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <bios useserial='yes'/>
    <smbios mode='sysinfo'/>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='usb' model='none'/>
    <controller type='scsi' index='0' model='virtio-scsi'/>
    {disks}
    {nics}
    <serial type='file'>
      <source path='{serial}' append='on'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>{qemu}</qemu:commandline>
</domain>
"#,
        serial = serial.display(),
    );
    lab.libvirt.define_xml(name, &xml);
}

fn condition(o: &Value, ty: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == ty).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn vm_is_discovered_and_its_inventory_matches_its_configuration() {
    let lab = Lab::new(71, "report_timeout_secs = 600");
    let m = machine(&lab, "disc-a", 1);
    lab.add_bmc();
    // bootplane registers the system and boots it into the discovery image.
    let s = lab.wait_server(
        &m.name,
        &m.uuid,
        Duration::from_secs(60),
        "Server in Discovery",
        |s| s["status"]["state"] == "Discovery",
    );
    let macs: Vec<&str> = s["status"]["networkInterfaces"]
        .as_array()
        .map(|l| l.iter().filter_map(|n| n["macAddress"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        macs,
        [m.macs[0].as_str(), m.macs[1].as_str()],
        "NICs from the BMC: {s:#}"
    );
    let s = lab.wait_server(
        &m.name,
        &m.uuid,
        Duration::from_secs(420),
        "Server Available",
        |s| s["status"]["state"] == "Available",
    );
    lab.keep_logs(&m.name);
    let st = &s["status"];
    assert_eq!(st["powerState"], "Off", "{s:#}");
    assert_eq!(lab.libvirt.state(&m.name), "shut off");
    assert_eq!(
        condition(&s, "Discovered")["reason"],
        "InventoryReported",
        "{s:#}"
    );
    // NICs: both MACs, both carriers up; the address bootplane leased from its dynamic
    // range is the lease's, not the machine's identity: not recorded (issue 32).
    let nics = st["networkInterfaces"].as_array().unwrap();
    let mut got: Vec<&str> = nics
        .iter()
        .map(|n| n["macAddress"].as_str().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, [m.macs[0].as_str(), m.macs[1].as_str()], "{s:#}");
    for n in nics {
        assert_eq!(n["carrierStatus"], "Up", "{n}");
    }
    let net = format!("10.199.{}.", lab.net);
    assert!(
        !nics
            .iter()
            .any(|n| n["ip"].as_str().is_some_and(|ip| ip.starts_with(&net))),
        "a dynamic-pool address registered: {s:#}"
    );
    // Disks: exactly the two SCSI disks, with their sizes, vendor and product.
    let drives: Vec<Value> = st["storages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|x| x["drives"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(drives.len(), 2, "{s:#}");
    let serials: Value = serde_json::from_str(
        s["metadata"]["annotations"]["bootplane.dev/drive-serials"]
            .as_str()
            .unwrap_or("{}"),
    )
    .unwrap();
    // The kernel names the disks in its probe order (it varies): each configured disk is
    // found by its serial number.
    for (serial, size, vendor, product) in &m.disks {
        let name = serials
            .as_object()
            .and_then(|o| o.iter().find(|(_, v)| *v == serial.as_str()))
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("no disk with serial {serial}: {serials}"));
        let d = drives
            .iter()
            .find(|d| d["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no {name}: {s:#}"));
        assert_eq!(d["capacity"], format!("{}Mi", size >> 20), "{d}");
        assert_eq!(d["vendor"], *vendor, "{d}");
        assert_eq!(d["model"], *product, "{d}");
    }
    // 2 vCPUs (QEMU: 2 sockets of 1 core), 1 GiB installed.
    let cpus = st["processors"].as_array().unwrap();
    let threads: u64 = cpus
        .iter()
        .map(|c| c["totalThreads"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(threads, 2, "{s:#}");
    assert_eq!(st["totalSystemMemory"], "1Gi", "{s:#}");
    assert_eq!(s["spec"]["systemUUID"], m.uuid.as_str());
    let _ = json!(null);
}

#[test]
fn vm_whose_agent_cannot_reach_bootplane_stays_in_discovery_with_a_reason() {
    // The links are cut once the discovery kernel starts, which must be before the report
    // timeout: about 30 s into the boot under TCG (the test prints it; the test beside
    // this one reports its whole inventory in ~40 s), so 75 s leaves 2.5 times that; every
    // second above it is a second of the run's longest chain (the VM tests, one at a time).
    let lab = Lab::new(72, "report_timeout_secs = 75\nattempts = 1");
    let m = machine(&lab, "disc-b", 2);
    lab.add_bmc();
    lab.wait_server(
        &m.name,
        &m.uuid,
        Duration::from_secs(60),
        "Server in Discovery",
        |s| s["status"]["state"] == "Discovery",
    );
    // Once iPXE has fetched the kernel and initrd, cut both links: Linux boots, the agent
    // finds no DHCP server and cannot reach bootplane.
    let t0 = Instant::now();
    wait_for(
        Duration::from_secs(240),
        || lab.serial(&m.name).contains("Linux version"),
        || {
            format!(
                "the discovery kernel did not start:\n{}",
                tail_lines(&lab.serial(&m.name), 40)
            )
        },
    );
    eprintln!(
        "{}: discovery kernel started {:.1?} after the Server entered Discovery",
        m.name,
        t0.elapsed()
    );
    let ifs = lab.libvirt.must(&["domiflist", &m.name]);
    for line in ifs.lines().skip(2) {
        if let Some(dev) = line.split_whitespace().next() {
            lab.libvirt.must(&["domif-setlink", &m.name, dev, "down"]);
        }
    }
    let s = lab.wait_server(
        &m.name,
        &m.uuid,
        Duration::from_secs(240),
        "InventoryTimeout",
        |s| condition(s, "Discovered")["reason"] == "InventoryTimeout",
    );
    lab.keep_logs(&m.name);
    assert_eq!(s["status"]["state"], "Discovery", "{s:#}");
    let msg = condition(&s, "Discovered")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("no inventory after 1 discovery boot"), "{msg}");
    wait_for(
        Duration::from_secs(60),
        || lab.libvirt.state(&m.name) == "shut off",
        || "the VM was not powered off".into(),
    );
    assert!(
        s["status"]["networkInterfaces"][0]["ip"].is_null(),
        "an inventory was written: {s:#}"
    );
}

/// A tenant's marker at the start, the middle and the end of a disk image file.
const TENANT_MARK: &[u8] = b"TENANT-SECRET-e2e-cleanup";

fn mark_offsets(size: u64) -> [u64; 3] {
    [
        4096,
        size / 2 + 12345,
        size - 4096 - TENANT_MARK.len() as u64,
    ]
}

#[test]
fn vm_released_from_its_claim_has_its_virtio_and_nvme_disks_wiped_before_it_is_available() {
    // No first boot: the Server is registered Available by the operator, so the one VM
    // boot of this test is the cleanup's.
    let lab = Lab::new(
        73,
        "first_boot = false\n[cleanup]\npolicy = \"metadata\"\nreport_timeout_secs = 420\nattempts = 1",
    );
    let (name, n) = ("wipe-a", lab.net);
    let uuid = format!("4c4c4544-00d1-00d1-00{n:02x}-000000000003");
    let mac = format!("52:54:00:d3:{n:02x}:03");
    let size: u64 = 64 << 20;
    let (vda, nvme) = (lab.path("wipe-a-vda.img"), lab.path("wipe-a-nvme.img"));
    for f in [&vda, &nvme] {
        let file = std::fs::File::create(f).unwrap();
        file.set_len(size).unwrap();
        for at in mark_offsets(size) {
            std::os::unix::fs::FileExt::write_all_at(&file, TENANT_MARK, at).unwrap();
        }
    }
    let disks = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{}'/>\
         <target dev='vda' bus='virtio'/><serial>SER-wipe-vda</serial></disk>",
        vda.display()
    );
    let qemu = format!(
        "<qemu:arg value='-drive'/><qemu:arg value='file={},if=none,id=nvm0,format=raw'/>\
         <qemu:arg value='-device'/><qemu:arg value='nvme,serial=SER-wipe-nvme,drive=nvm0,bus=pci.0,addr=0x1f'/>",
        nvme.display()
    );
    define(
        &lab,
        (name, &uuid),
        std::slice::from_ref(&mac),
        &disks,
        &qemu,
    );
    lab.add_bmc();
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server registered",
        |s| s["status"]["state"] == "Initial",
    );
    let server = format!("sushy-{uuid}");
    // The operator registers it, and a tenant claims it asking for a full wipe at release.
    let out = bootplane_cli(
        &lab.ns,
        &lab.path("state"),
        &["apply", "--subresource=status", "-f", "-"],
        Some(&format!(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: {server}}}\n\
             status: {{state: Available}}\n"
        )),
    );
    assert!(out.status.success(), "{}", text(&out));
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server Available and off",
        |s| s["status"]["state"] == "Available" && s["status"]["powerState"] == "Off",
    );
    lab.apply(&format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\n\
         metadata: {{name: tenant, namespace: default, annotations: {{bootplane.dev/cleanup-policy: full}}}}\n\
         spec: {{power: \"Off\", image: \"{IMAGE}\", serverRef: {{name: {server}}}}}\n"
    ));
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server Reserved",
        |s| s["status"]["state"] == "Reserved",
    );
    // The tenant lets go: Cleanup, the agent boots, wipes both disks (full: the tenant
    // asked for more than the Server's metadata), reads them back, reports, powers off.
    let out = bootplane_cli(
        &lab.ns,
        &lab.path("state"),
        &["delete", "serverclaim", "tenant", "-n", "default"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server in Cleanup",
        |s| s["status"]["state"] == "Cleanup",
    );
    let s = lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(480),
        "Server Available after its wipe",
        |s| s["status"]["state"] == "Available" || s["status"]["state"] == "Error",
    );
    lab.keep_logs(name);
    assert_eq!(
        s["status"]["state"],
        "Available",
        "{s:#}\n{}",
        tail_lines(&lab.serial(name), 40)
    );
    let c = condition(&s, "Cleaned");
    assert_eq!(c["reason"], "Verified", "{s:#}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("2 disk(s) wiped (full)"),
        "{c}"
    );
    assert_eq!(s["status"]["powerState"], "Off", "{s:#}");
    wait_for(
        Duration::from_secs(60),
        || lab.libvirt.state(name) == "shut off",
        || "the VM was not powered off".into(),
    );
    let last: Value = serde_json::from_str(
        s["metadata"]["annotations"]["bootplane.dev/last-wipe"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let devices: Vec<&str> = last["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    assert!(
        devices.contains(&"/dev/vda") && devices.contains(&"/dev/nvme0n1"),
        "{last}"
    );
    // Read from the host: no marker left, every byte zero.
    for f in [&vda, &nvme] {
        let data = std::fs::read(f).unwrap();
        assert_eq!(data.len() as u64, size);
        let first = data.iter().position(|b| *b != 0);
        assert_eq!(first, None, "{}: a non-zero byte at {first:?}", f.display());
    }
}

#[test]
fn vm_claimed_on_a_disk_image_installs_it_through_the_agent_image_and_reboots() {
    // No first boot, no wipe: the one VM boot of this test is the install's.
    let lab = Lab::new(
        77,
        "first_boot = false\n[cleanup]\npolicy = \"none\"\nreport_timeout_secs = 420",
    );
    let images = lab.path("images");
    let (raw, sha) = crate::install_flow::disk_image(&images, "e2e");
    let cat = images.join("catalog.toml");
    let mut catalog = std::fs::read_to_string(&cat).unwrap();
    catalog.push_str(&format!(
        "\n[[disk]]\nref = \"deb:disk\"\npath = \"disk/disk.img.zst\"\nsha256 = \"{sha}\"\nroot_device_hints = {{ size = \">= 0\" }}\n"
    ));
    std::fs::write(&cat, catalog).unwrap();
    assert_eq!(
        unsafe { libc::kill(lab.bp.as_ref().unwrap().pid(), libc::SIGHUP) },
        0
    );
    let (name, n) = ("inst-a", lab.net);
    let uuid = format!("4c4c4544-00d1-00d1-00{n:02x}-000000000004");
    let mac = format!("52:54:00:d4:{n:02x}:04");
    // The machine's disk, holding a previous tenant's bytes.
    let vda = lab.path("inst-a-vda.img");
    std::fs::write(&vda, vec![0xa5u8; 256 << 20]).unwrap();
    let disks = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{}'/>\
         <target dev='vda' bus='virtio'/><serial>SER-inst-vda</serial></disk>",
        vda.display()
    );
    define(&lab, (name, &uuid), std::slice::from_ref(&mac), &disks, "");
    lab.add_bmc();
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server registered",
        |s| s["status"]["state"] == "Initial",
    );
    let server = format!("sushy-{uuid}");
    let out = bootplane_cli(
        &lab.ns,
        &lab.path("state"),
        &["apply", "--subresource=status", "-f", "-"],
        Some(&format!(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: {server}}}\n\
             status: {{state: Available}}\n"
        )),
    );
    assert!(out.status.success(), "{}", text(&out));
    lab.wait_server(
        name,
        &uuid,
        Duration::from_secs(60),
        "Server Available and off",
        |s| s["status"]["state"] == "Available" && s["status"]["powerState"] == "Off",
    );
    let ign = crate::install_flow::IGNITION.replace('"', "\\\"");
    lab.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: inst-ign, namespace: default}}\n\
         stringData: {{ignition: \"{ign}\"}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\n\
         metadata: {{name: tenant, namespace: default}}\n\
         spec: {{power: \"On\", image: \"deb:disk\", serverRef: {{name: {server}}}, ignitionSecretRef: {{name: inst-ign}}}}\n"
    ));
    // Installed: the agent image booted, wrote the image and the Ignition, reported.
    let deadline = Instant::now() + Duration::from_secs(480);
    let sbc = loop {
        let v = lab.get_json("serverbootconfigurations", "tenant");
        let installed = v.as_ref().is_some_and(|v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|l| l.iter().any(|c| c["type"] == "Installed"))
        });
        if installed {
            break v.unwrap();
        }
        if Instant::now() > deadline {
            lab.keep_logs(name);
            panic!(
                "no install report: {v:#?}\n--- console ---\n{}\n--- bootplane ---\n{}",
                tail_lines(&lab.serial(name), 60),
                tail_lines(&lab.log(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    lab.keep_logs(name);
    let c = condition(&sbc, "Installed");
    assert_eq!(
        c["status"],
        "True",
        "{sbc:#}\n{}",
        tail_lines(&lab.serial(name), 40)
    );
    let msg = c["message"].as_str().unwrap();
    assert!(msg.contains("/dev/vda") && msg.contains(&sha), "{msg}");
    // The agent rebooted the machine, which is now told to boot its disk.
    wait_for(
        Duration::from_secs(120),
        || lab.serial(name).contains("booting from disk"),
        || {
            format!(
                "no local boot after the install:\n{}",
                tail_lines(&lab.serial(name), 40)
            )
        },
    );
    let _ = lab.libvirt.virsh(&["destroy", name]);
    // From the host: the disk holds the image's tables and ESP, and the Ignition.
    let want = std::fs::read(&raw.0).unwrap();
    let got = std::fs::read(&vda).unwrap();
    let esp_end = 17 << 20;
    assert!(
        got[..esp_end] == want[..esp_end],
        "the disk does not hold the image"
    );
    // (A Backing removes its file on drop: this one is forgotten, the lab's dir goes.)
    let backing = crate::probe_wipe::Backing(vda.clone());
    let lp = crate::probe_wipe::Loop::new(&backing, true);
    let _ = Command::new("partx").args(["-a", &lp.dev]).status();
    let dump = support::process::tool(
        "debugfs",
        &["-R", "cat /ignition/config.ign", &format!("{}p2", lp.dev)],
    );
    // The claim's Ignition as bootplane serves it: the secret's file, merged with the
    // lab's templates (the hostname).
    let ign: Value = serde_json::from_slice(&dump.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&dump.stdout)));
    let paths: Vec<&str> = ign["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"/etc/installed-by") && paths.contains(&"/etc/hostname"),
        "{ign}"
    );
    drop(lp);
    std::mem::forget(backing);
}
