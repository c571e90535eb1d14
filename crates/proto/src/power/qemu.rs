//! The `qemu` power driver: a virtual BMC for demos and end-to-end tests. Powering a
//! Server On starts a QEMU VM (TCG by default) whose NIC carries the Server's MAC on a
//! tap device attached to a bridge; powering it Off asks the guest to shut down
//! (ACPI, over QMP) and kills QEMU after a grace period.
//!
//! - The MAC is the first `status.networkInterfaces[].macAddress` of the Server.
//! - The firmware is chosen per Server by the annotation (or label)
//!   `bootplane.dev/qemu-firmware`: `bios` (SeaBIOS + QEMU's iPXE NIC ROM), `uefi`
//!   (OVMF with its own PXE stack: the NIC's option ROM is removed) or `uefi-http`
//!   (OVMF native HTTP Boot: PXE disabled through fw_cfg). Default: `[power.qemu] firmware`.
//! - The tap is `<tap_prefix><8 hex digits of the server name>` (at most 15 bytes), created
//!   in the configured network namespace (or bootplane's own) and enslaved to `bridge`.
//! - Per VM, `<state_dir>/qemu/<server>/` holds `serial.log` (the serial console;
//!   SeaBIOS/iPXE mirror their screen there through `etc/sercon-port`), the QMP socket and
//!   the UEFI variable store.
//! - VMs die with bootplane: QEMU is started from one long-lived launcher thread with
//!   `PR_SET_PDEATHSIG = SIGKILL` (the death signal follows the thread that forked, so a
//!   short-lived worker thread must not be the parent), and dropping the driver stops them.
//! - Idempotent: On for a running VM and Off for a stopped one change nothing; a VM that
//!   exited by itself counts as Off and is started again on the next On.
//!
//! Written by hand (no crate): it is a process supervisor of ~300 lines around
//! `std::process`, and the QMP exchange needed is two JSON lines on a unix socket.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Outcome, Power, PowerDriver};
use crate::model::ident;

/// Annotation (or label) on a Server choosing its firmware.
pub(crate) const FIRMWARE_KEY: &str = "bootplane.dev/qemu-firmware";

/// `[power.qemu]`: how the qemu driver builds VMs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct QemuConfig {
    /// The QEMU binary.
    pub binary: String,
    /// Network namespace the tap (and QEMU) live in; none = bootplane's own.
    pub netns: Option<String>,
    /// Bridge the tap is attached to (must exist); none = a bare tap.
    pub bridge: Option<String>,
    /// Tap names are this prefix + 8 hex digits (prefix at most 7 bytes).
    pub tap_prefix: String,
    /// Default firmware: `bios`, `uefi` or `uefi-http` (see [`FIRMWARE_KEY`]).
    pub firmware: String,
    /// Guest memory.
    pub memory_mib: u32,
    pub cpus: u32,
    /// `-accel` value (`tcg`; firmware hangs under KVM on some hosts).
    pub accel: String,
    /// NIC model for `bios` (`e1000`: Debian's ipxe-qemu has its iPXE ROM, and the
    /// Linux driver is one module).
    pub nic_model: String,
    /// NIC model for `uefi`/`uefi-http`. The option ROM is removed there so that OVMF's
    /// own network stack boots, so OVMF must drive the NIC itself: `virtio-net-pci`
    /// (OVMF has no e1000 driver; with `e1000` and no ROM it finds no network device).
    pub uefi_nic_model: String,
    /// OVMF code and variable-store templates (the store is copied per VM).
    pub ovmf_code: PathBuf,
    pub ovmf_vars: PathBuf,
    /// How long Off waits for an ACPI shutdown before killing QEMU.
    pub stop_grace_ms: u64,
    /// Extra QEMU arguments appended to every VM.
    pub extra_args: Vec<String>,
}

impl Default for QemuConfig {
    fn default() -> Self {
        QemuConfig {
            binary: "qemu-system-x86_64".into(),
            netns: None,
            bridge: None,
            tap_prefix: "bpq".into(),
            firmware: "bios".into(),
            memory_mib: 512,
            cpus: 1,
            accel: "tcg".into(),
            nic_model: "e1000".into(),
            uefi_nic_model: "virtio-net-pci".into(),
            ovmf_code: PathBuf::from("/usr/share/OVMF/OVMF_CODE_4M.fd"),
            ovmf_vars: PathBuf::from("/usr/share/OVMF/OVMF_VARS_4M.fd"),
            stop_grace_ms: 5_000,
            extra_args: Vec::new(),
        }
    }
}

impl QemuConfig {
    pub fn validate(&self) -> Result<()> {
        Firmware::parse(&self.firmware)?;
        if self.tap_prefix.is_empty() || self.tap_prefix.len() > 7 {
            bail!("power.qemu.tap_prefix must be 1 to 7 bytes");
        }
        if self.memory_mib < 64 || self.cpus == 0 {
            bail!("power.qemu needs memory_mib >= 64 and cpus >= 1");
        }
        Ok(())
    }
}

/// Which firmware a VM boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Firmware {
    /// SeaBIOS with QEMU's iPXE NIC ROM.
    Bios,
    /// OVMF, its own PXE stack (NIC ROM removed).
    Uefi,
    /// OVMF native HTTP Boot (PXE disabled).
    UefiHttp,
}

impl Firmware {
    pub(crate) fn parse(s: &str) -> Result<Firmware> {
        match s {
            "bios" => Ok(Firmware::Bios),
            "uefi" => Ok(Firmware::Uefi),
            "uefi-http" => Ok(Firmware::UefiHttp),
            other => bail!("unknown qemu firmware {other:?} (expected bios, uefi or uefi-http)"),
        }
    }
}

/// Everything needed to start one VM (derived from a Server and the config).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VmSpec {
    pub server: String,
    pub mac: String,
    /// `spec.systemUUID`, given to the VM as its SMBIOS UUID (iPXE's `${uuid}`).
    pub uuid: Option<String>,
    pub firmware: Firmware,
    pub tap: String,
    pub dir: PathBuf,
}

/// Read the VM description off a Server object.
pub(crate) fn vm_spec(cfg: &QemuConfig, state_dir: &Path, server: &Value) -> Result<VmSpec> {
    let name = crate::model::meta::name(server).to_string();
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        bail!("server name {name:?} cannot name a VM directory");
    }
    let mac = server
        .pointer("/status/networkInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|n| n.get("macAddress").and_then(Value::as_str))
        .with_context(|| format!("server {name} has no status.networkInterfaces[].macAddress"))?;
    // The boot side's MAC syntax (`:`/`-` separated or 12 hex digits), in QEMU's form.
    let mac = match ident::parse_mac(mac.trim()) {
        Ok(m) => ident::MacFmt(&m).to_string(),
        Err(_) => bail!("server {name} has a malformed MAC {mac:?}"),
    };
    let fw = ["annotations", "labels"]
        .iter()
        .find_map(|k| {
            server
                .pointer(&format!("/metadata/{k}"))
                .and_then(|m| m.get(FIRMWARE_KEY))
                .and_then(Value::as_str)
        })
        .unwrap_or(&cfg.firmware);
    let firmware = Firmware::parse(fw).with_context(|| format!("server {name}"))?;
    let uuid = server
        .pointer("/spec/systemUUID")
        .and_then(Value::as_str)
        .and_then(|u| ident::parse_uuid(u).ok());
    let h = name.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    });
    Ok(VmSpec {
        tap: format!("{}{h:08x}", cfg.tap_prefix),
        dir: state_dir.join("qemu").join(&name),
        server: name,
        mac,
        uuid,
        firmware,
    })
}

/// The QEMU command line for a VM (without the binary and the netns wrapper).
pub(crate) fn qemu_args(cfg: &QemuConfig, vm: &VmSpec) -> Vec<String> {
    let d = |f: &str| vm.dir.join(f).display().to_string();
    let mut a: Vec<String> = vec![
        "-name".into(),
        format!("bootplane-{}", vm.server),
        "-accel".into(),
        cfg.accel.clone(),
        "-m".into(),
        cfg.memory_mib.to_string(),
        "-smp".into(),
        cfg.cpus.to_string(),
        "-nodefaults".into(),
        "-display".into(),
        "none".into(),
        "-vga".into(),
        "none".into(),
        "-serial".into(),
        format!("file:{}", d("serial.log")),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", d("qmp.sock")),
        "-boot".into(),
        "order=n".into(),
        "-netdev".into(),
        format!("tap,id=n0,ifname={},script=no,downscript=no", vm.tap),
    ];
    let model = match vm.firmware {
        Firmware::Bios => &cfg.nic_model,
        Firmware::Uefi | Firmware::UefiHttp => &cfg.uefi_nic_model,
    };
    // bootindex: OVMF orders its boot options by it (SeaBIOS takes `-boot order=n`).
    let mut nic = format!("{model},netdev=n0,mac={},bootindex=1", vm.mac);
    if let Some(u) = &vm.uuid {
        a.push("-uuid".into());
        a.push(u.clone());
    }
    match vm.firmware {
        Firmware::Bios => {
            // SeaBIOS and the iPXE ROM print to the screen only; mirror it to COM1.
            a.push("-fw_cfg".into());
            a.push(format!("name=etc/sercon-port,file={}", d("sercon-port")));
        }
        Firmware::Uefi | Firmware::UefiHttp => {
            a.push("-drive".into());
            a.push(format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={}",
                cfg.ovmf_code.display()
            ));
            a.push("-drive".into());
            a.push(format!(
                "if=pflash,format=raw,unit=1,file={}",
                d("OVMF_VARS.fd")
            ));
            nic.push_str(",romfile=");
            if vm.firmware == Firmware::UefiHttp {
                for v in ["IPv4PXESupport", "IPv6PXESupport"] {
                    a.push("-fw_cfg".into());
                    a.push(format!("name=opt/org.tianocore/{v},string=n"));
                }
            }
        }
    }
    a.push("-device".into());
    a.push(nic);
    a.extend(cfg.extra_args.iter().cloned());
    a
}

struct Vm {
    child: Child,
    spec: VmSpec,
}

enum Launch {
    Spawn(Box<Command>, mpsc::Sender<std::io::Result<Child>>),
}

/// The driver: running VMs by server name.
pub(crate) struct Qemu {
    cfg: QemuConfig,
    state_dir: PathBuf,
    vms: Mutex<HashMap<String, Vm>>,
    launcher: Mutex<mpsc::Sender<Launch>>,
}

impl Qemu {
    pub(crate) fn new(cfg: QemuConfig, state_dir: &Path) -> Result<Arc<Qemu>> {
        cfg.validate()?;
        let (tx, rx) = mpsc::channel::<Launch>();
        // The launcher lives as long as the process (it ends when the driver is dropped
        // and the channel closes); children are forked from it so their death signal
        // fires when bootplane dies, not when a worker thread retires.
        std::thread::Builder::new()
            .name("qemu-launcher".into())
            .spawn(move || {
                while let Ok(Launch::Spawn(mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .context("starting the qemu launcher thread")?;
        Ok(Arc::new(Qemu {
            cfg,
            state_dir: state_dir.to_path_buf(),
            vms: Mutex::new(HashMap::new()),
            launcher: Mutex::new(tx),
        }))
    }

    fn ip(&self, args: &[&str]) -> Result<()> {
        let mut c = Command::new("ip");
        if let Some(ns) = &self.cfg.netns {
            c.args(["-n", ns]);
        }
        let out = c
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running ip")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn setup_tap(&self, tap: &str) -> Result<()> {
        // A tap left over from a VM that died is reused.
        let _ = self.ip(&["link", "del", tap]);
        self.ip(&["tuntap", "add", "dev", tap, "mode", "tap"])?;
        if let Some(br) = &self.cfg.bridge {
            self.ip(&["link", "set", tap, "master", br])?;
        }
        self.ip(&["link", "set", tap, "up"])
    }

    fn start(&self, vm: &VmSpec) -> Result<Child> {
        std::fs::create_dir_all(&vm.dir)
            .with_context(|| format!("creating {}", vm.dir.display()))?;
        let _ = std::fs::remove_file(vm.dir.join("qmp.sock"));
        // Each power-on starts a fresh console log; the previous one is kept.
        let serial = vm.dir.join("serial.log");
        if serial.exists() {
            let _ = std::fs::rename(&serial, vm.dir.join("serial.log.prev"));
        }
        match vm.firmware {
            Firmware::Bios => std::fs::write(vm.dir.join("sercon-port"), [0xf8u8, 0x03])
                .context("writing sercon-port")?,
            Firmware::Uefi | Firmware::UefiHttp => {
                let vars = vm.dir.join("OVMF_VARS.fd");
                std::fs::copy(&self.cfg.ovmf_vars, &vars).with_context(|| {
                    format!(
                        "copying {} (apt-get install ovmf)",
                        self.cfg.ovmf_vars.display()
                    )
                })?;
            }
        }
        self.setup_tap(&vm.tap)
            .with_context(|| format!("creating tap {}", vm.tap))?;
        let mut cmd = match &self.cfg.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &self.cfg.binary]);
                c
            }
            None => Command::new(&self.cfg.binary),
        };
        let log = std::fs::File::create(vm.dir.join("qemu.log")).context("creating qemu.log")?;
        cmd.args(qemu_args(&self.cfg, vm))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        crate::sys::die_with_parent(&mut cmd);
        let (tx, rx) = mpsc::channel();
        self.launcher
            .lock()
            .map_err(|_| anyhow::anyhow!("qemu launcher lock poisoned"))?
            .send(Launch::Spawn(Box::new(cmd), tx))
            .map_err(|_| anyhow::anyhow!("qemu launcher thread is gone"))?;
        let child = rx
            .recv()
            .context("qemu launcher thread is gone")?
            .with_context(|| format!("starting {}", self.cfg.binary))?;
        tracing::info!(server = %vm.server, mac = %vm.mac, tap = %vm.tap, firmware = ?vm.firmware, pid = child.id(), "qemu: VM started");
        Ok(child)
    }

    /// ACPI power button over QMP, wait up to the grace period, then SIGKILL.
    fn stop(&self, mut vm: Vm) {
        let grace = Duration::from_millis(self.cfg.stop_grace_ms);
        if grace > Duration::ZERO && matches!(vm.child.try_wait(), Ok(None)) {
            if let Err(e) = qmp_powerdown(&vm.spec.dir.join("qmp.sock")) {
                tracing::debug!(server = %vm.spec.server, error = %format!("{e:#}"), "qemu: no ACPI shutdown");
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && matches!(vm.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = vm.child.kill();
        let _ = vm.child.wait();
        let _ = self.ip(&["link", "del", &vm.spec.tap]);
        tracing::info!(server = %vm.spec.server, "qemu: VM stopped");
    }

    fn set(&self, server: &Value, want: Power) -> Result<Outcome> {
        let spec = vm_spec(&self.cfg, &self.state_dir, server)?;
        let mut vms = self
            .vms
            .lock()
            .map_err(|_| anyhow::anyhow!("qemu driver lock poisoned"))?;
        // A VM that exited on its own (guest poweroff, crash) is Off.
        let exited = match vms.get_mut(&spec.server) {
            Some(vm) => !matches!(vm.child.try_wait(), Ok(None)),
            None => false,
        };
        if exited {
            if let Some(vm) = vms.remove(&spec.server) {
                self.stop(vm);
            }
        }
        match want {
            Power::On => {
                if let Some(vm) = vms.get(&spec.server) {
                    if vm.spec == spec {
                        return Ok(Outcome::Done);
                    }
                    // MAC or firmware changed: restart with the new hardware.
                    if let Some(vm) = vms.remove(&spec.server) {
                        self.stop(vm);
                    }
                }
                let child = self.start(&spec)?;
                vms.insert(spec.server.clone(), Vm { child, spec });
                Ok(Outcome::Done)
            }
            Power::Off => {
                if let Some(vm) = vms.remove(&spec.server) {
                    drop(vms);
                    self.stop(vm);
                }
                Ok(Outcome::Done)
            }
        }
    }
}

/// Send `system_powerdown` over a QMP socket.
fn qmp_powerdown(sock: &Path) -> Result<()> {
    let s = std::os::unix::net::UnixStream::connect(sock)
        .with_context(|| format!("connecting {}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).context("reading the qmp greeting")?;
    for cmd in ["qmp_capabilities", "system_powerdown"] {
        writeln!(w, "{{\"execute\":\"{cmd}\"}}")?;
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                bail!("qmp closed");
            }
            // Skip asynchronous events until the command's answer.
            if line.contains("\"return\"") || line.contains("\"error\"") {
                break;
            }
        }
    }
    Ok(())
}

impl PowerDriver for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }
    fn set_power(&self, server: &Value, want: Power) -> Result<Outcome> {
        // Stopping may wait for the grace period: let the runtime move other tasks off
        // this worker meanwhile.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.set(server, want))
            }
            _ => self.set(server, want),
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let vms: Vec<Vm> = match self.vms.get_mut() {
            Ok(m) => m.drain().map(|(_, v)| v).collect(),
            Err(_) => return,
        };
        for mut vm in vms {
            let _ = vm.child.kill();
            let _ = vm.child.wait();
            let _ = self.ip(&["link", "del", &vm.spec.tap]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(ann: Option<&str>) -> Value {
        let mut s = json!({
            "metadata": {"name": "node-1"},
            "spec": {"systemUUID": "4C4C4544-0042-0042-0042-000000000042"},
            "status": {"networkInterfaces": [{"name": "eth0", "macAddress": "52:54:00:AB:cd:01"}]},
        });
        if let Some(f) = ann {
            s["metadata"]["annotations"] = json!({FIRMWARE_KEY: f});
        }
        s
    }

    #[test]
    fn spec_from_server() {
        let cfg = QemuConfig::default();
        let v = vm_spec(&cfg, Path::new("/st"), &server(None)).unwrap();
        assert_eq!(v.mac, "52:54:00:ab:cd:01");
        assert_eq!(
            v.uuid.as_deref(),
            Some("4c4c4544-0042-0042-0042-000000000042")
        );
        assert_eq!(v.firmware, Firmware::Bios);
        assert!(v.tap.starts_with("bpq") && v.tap.len() == 11, "{}", v.tap);
        assert_eq!(v.dir, Path::new("/st/qemu/node-1"));
        let v = vm_spec(&cfg, Path::new("/st"), &server(Some("uefi-http"))).unwrap();
        assert_eq!(v.firmware, Firmware::UefiHttp);
        let mut s = server(None);
        s["metadata"]["labels"] = json!({FIRMWARE_KEY: "uefi"});
        assert_eq!(
            vm_spec(&cfg, Path::new("/st"), &s).unwrap().firmware,
            Firmware::Uefi
        );
    }

    #[test]
    fn bad_servers_are_errors() {
        let cfg = QemuConfig::default();
        let e = vm_spec(&cfg, Path::new("/"), &server(Some("coreboot"))).unwrap_err();
        assert!(format!("{e:#}").contains("coreboot"));
        let mut s = server(None);
        s["status"]["networkInterfaces"][0]["macAddress"] = json!("52:54:00:zz:00:01");
        assert!(vm_spec(&cfg, Path::new("/"), &s).is_err());
        let s = json!({"metadata": {"name": "x"}});
        assert!(
            format!("{:#}", vm_spec(&cfg, Path::new("/"), &s).unwrap_err()).contains("macAddress")
        );
        let s = json!({"metadata": {"name": "../x"}, "status": server(None)["status"]});
        assert!(vm_spec(&cfg, Path::new("/"), &s).is_err());
    }

    #[test]
    fn command_lines_per_firmware() {
        let cfg = QemuConfig::default();
        let v = vm_spec(&cfg, Path::new("/st"), &server(None)).unwrap();
        let a = qemu_args(&cfg, &v).join(" ");
        assert!(a.contains("-accel tcg"), "{a}");
        assert!(
            a.contains("-uuid 4c4c4544-0042-0042-0042-000000000042"),
            "{a}"
        );
        assert!(a.contains("-serial file:/st/qemu/node-1/serial.log"), "{a}");
        assert!(a.contains("name=etc/sercon-port,file=/st/qemu/node-1/sercon-port"));
        assert!(
            a.contains("e1000,netdev=n0,mac=52:54:00:ab:cd:01,bootindex=1"),
            "{a}"
        );
        assert!(!a.contains("romfile=") && !a.contains("pflash"), "{a}");
        let v = vm_spec(&cfg, Path::new("/st"), &server(Some("uefi"))).unwrap();
        let a = qemu_args(&cfg, &v).join(" ");
        assert!(
            a.contains("romfile=") && a.contains("OVMF_CODE_4M.fd"),
            "{a}"
        );
        assert!(a.contains("virtio-net-pci,netdev=n0"), "{a}");
        assert!(!a.contains("PXESupport"), "{a}");
        let v = vm_spec(&cfg, Path::new("/st"), &server(Some("uefi-http"))).unwrap();
        let a = qemu_args(&cfg, &v).join(" ");
        assert!(
            a.contains("name=opt/org.tianocore/IPv4PXESupport,string=n"),
            "{a}"
        );
        assert!(
            a.contains("name=opt/org.tianocore/IPv6PXESupport,string=n"),
            "{a}"
        );
    }

    #[test]
    fn config_checked() {
        let mut c = QemuConfig::default();
        assert!(c.validate().is_ok());
        c.tap_prefix = "toolongx".into();
        assert!(c.validate().is_err());
        let c = QemuConfig {
            firmware: "efi".into(),
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }
}
