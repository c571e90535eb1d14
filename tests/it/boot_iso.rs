//! The boot ISO booted for real: bootplane (`serve`: authoritative DHCP, the boot HTTP
//! listener, the `test` power driver) runs in a network namespace with a bridge; the
//! test downloads `/boot.iso` and a machine's signed `/ipxe/boot.iso?server=&token=`
//! from it over HTTP and boots each in QEMU (SeaBIOS, TCG, `-cdrom`, `-boot d`, an e1000
//! NIC without option ROM on a tap on that bridge), at the same time:
//!
//! - the generic ISO on a VM with the registered MAC of Server `iso-generic`: ISOLINUX
//!   → iPXE → `chain /boot.ipxe` → `/ipxe/script?uuid=&mac=` → its own script;
//! - the per-machine ISO of Server `iso-signed` on a VM whose MAC is registered for no
//!   Server, so only the signed script URL inside that ISO can identify it;
//! - the generic ISO on a UEFI VM (OVMF, its PXE off, virtio-net) of Server `iso-uefi`:
//!   the ISO's UEFI El Torito entry → `EFI/BOOT/BOOTX64.EFI` (`ipxe.efi`) → iPXE's own
//!   DHCP → bootplane's DHCP answer (`/boot.ipxe`) → its script.
//!
//! Asserted from bootplane's side: every boot configuration gets `IPXEScriptFetched`,
//! the access log shows each VM's address fetching its script, and no firmware fetched
//! `ipxe.efi` over the network (iPXE came from the CDs). The token for the
//! ISO URL is minted here with bootplane's own signer from the state directory's key and
//! the boot configuration's UID and generation and the Server's boot generation, as `BootHttp::signed_boot_url` mints it.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::api::condition_true;
use support::bootplane::{bootplane_cli, tail};
use support::image::tiny_ipxe_image;
use support::netns::Netns;
use support::process::*;
use support::require::*;

const NET: &str = "10.199.91";

struct Lab {
    ns: Netns,
    dir: tempfile::TempDir,
    bp: Option<Proc>,
    vms: Vec<Proc>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for vm in &mut self.vms {
            vm.kill9();
        }
        if let Some(mut p) = self.bp.take() {
            p.kill9();
        }
    }
}

impl Lab {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn log(&self) -> String {
        read(&self.path("bootplane.log"))
    }

    fn start() -> Lab {
        let ns = Netns::new("iso");
        ns.bridge("br0", &format!("{NET}.1/24"));
        let mut lab = Lab {
            ns,
            dir: tempfile::tempdir().unwrap(),
            bp: None,
            vms: Vec::new(),
        };
        let images = lab.path("images");
        tiny_ipxe_image(&images, "boot-iso test kernel");
        let cfg = format!(
            r#"state_dir = "{state}"
[http]
listen = "{NET}.1:8080"
public_url = "http://{NET}.1:8080"
assets_dir = "{assets}"
[dhcp]
enabled = true
interface = "br0"
mode = "authoritative"
range = "{NET}.100-{NET}.150"
lease_time_secs = 600
[boot]
images_dir = "{images}"
[controller]
power_driver = "test"
"#,
            state = lab.path("state").display(),
            assets = lab.path("assets").display(),
            images = images.display(),
        );
        std::fs::create_dir_all(lab.path("assets")).unwrap();
        std::fs::write(lab.path("bootplane.toml"), cfg).unwrap();
        let log = std::fs::File::create(lab.path("bootplane.log")).unwrap();
        let mut c = lab.ns.cmd(env!("CARGO_BIN_EXE_bootplane"));
        c.args([
            "serve",
            "--config",
            lab.path("bootplane.toml").to_str().unwrap(),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "info,bootplane::http::access=info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        lab.bp = Some(Proc::spawn(c));
        wait_for(
            Duration::from_secs(30),
            || {
                let l = lab.log();
                l.contains("dhcp server listening") && l.contains("bootplane started")
            },
            || format!("bootplane did not start: {}", lab.log()),
        );
        assert!(!lab.log().contains("boot iso unavailable"), "{}", lab.log());
        lab
    }

    fn cli(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = bootplane_cli(&self.ns, &self.path("state"), args, stdin);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The claim's boot configuration; `Null` until the claim controller has made it
    /// (it follows the binding, a moment after `apply`).
    fn sbc(&self, claim: &str) -> Value {
        let out = bootplane_cli(
            &self.ns,
            &self.path("state"),
            &["get", "sbc", claim, "-o", "json"],
            None,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && err.contains("NotFound") {
            return Value::Null;
        }
        assert!(out.status.success(), "get sbc {claim}: {err}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Download `url` from inside the namespace to `file`.
    fn download(&self, url: &str, file: &Path) {
        let out = run_for(
            self.ns
                .cmd("curl")
                .args(["-sSf", "-o", file.to_str().unwrap(), url]),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "curl {url}: {}", text(&out));
    }

    /// Boot `iso` in a VM with NIC `mac` on a new tap on br0: SeaBIOS, or with `uefi`
    /// OVMF (its own PXE off, the CD first in its boot order).
    fn boot(&mut self, tap: &str, mac: &str, iso: &Path, uefi: bool) {
        self.ns.ip(&["tuntap", "add", tap, "mode", "tap"]);
        self.ns.ip(&["link", "set", tap, "master", "br0"]);
        self.ns.ip(&["link", "set", tap, "up"]);
        let serial = self.path(&format!("{tap}.serial"));
        let mut a: Vec<String> = [
            "-machine",
            "pc,accel=tcg",
            "-m",
            "256",
            "-display",
            "none",
            "-no-reboot",
            "-device",
            "ide-cd,drive=cd0,bootindex=0",
        ]
        .map(String::from)
        .to_vec();
        a.push("-serial".into());
        a.push(format!("file:{}", serial.display()));
        a.push("-netdev".into());
        a.push(format!("tap,id=n0,ifname={tap},script=no,downscript=no"));
        a.push("-drive".into());
        a.push(format!(
            "file={},media=cdrom,if=none,id=cd0,readonly=on",
            iso.display()
        ));
        a.push("-device".into());
        if uefi {
            a.push(format!("virtio-net-pci,netdev=n0,mac={mac},romfile="));
            let vars = self.path(&format!("{tap}.vars.fd"));
            std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars).unwrap();
            a.push("-drive".into());
            a.push(
                "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"
                    .into(),
            );
            a.push("-drive".into());
            a.push(format!(
                "if=pflash,format=raw,unit=1,file={}",
                vars.display()
            ));
            for v in ["IPv4PXESupport", "IPv6PXESupport"] {
                a.push("-fw_cfg".into());
                a.push(format!("name=opt/org.tianocore/{v},string=n"));
            }
        } else {
            a.push(format!("e1000,netdev=n0,mac={mac},romfile="));
        }
        let mut c = self.ns.cmd("qemu-system-x86_64");
        c.args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path(&format!("{tap}.qemu.log"))).unwrap());
        self.vms.push(Proc::spawn(c));
    }
}

fn server_and_claim(name: &str, mac: &str, last: u8) -> String {
    format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: {name}}}\n\
         spec: {{systemUUID: 4c4c4544-0150-0150-0150-0000000000{last:02x}}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"{mac}\"}}]}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: {name}-claim, namespace: default}}\n\
         spec: {{power: \"On\", image: \"os-image:latest\", serverRef: {{name: {name}}}}}\n---\n"
    )
}

/// The access log line of a script fetch by `server` from a leased address.
fn script_fetch_by(log: &str, server: &str) -> Option<String> {
    log.lines()
        .find(|l| {
            l.contains("path=/ipxe/script")
                && l.contains("status=200")
                && l.contains(&format!("server=\"{server}\""))
                && l.contains(&format!("client={NET}."))
        })
        .map(String::from)
}

#[test]
fn generic_and_per_machine_iso_boot_and_fetch_their_scripts() {
    require_tools(&["qemu-system-x86_64", "ip", "curl"]);
    for (f, package) in [
        ("/usr/lib/ISOLINUX/isolinux.bin", "isolinux"),
        (
            "/usr/lib/syslinux/modules/bios/ldlinux.c32",
            "syslinux-common",
        ),
        ("/usr/lib/ipxe/ipxe.lkrn", "ipxe"),
        ("/usr/share/seabios/bios-256k.bin", "seabios"),
        ("/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf"),
        ("/usr/lib/ipxe/ipxe.efi", "ipxe"),
    ] {
        require_file(f, package);
    }
    let mut lab = Lab::start();
    let yaml = server_and_claim("iso-generic", "52:54:00:15:00:01", 1)
        + &server_and_claim("iso-signed", "52:54:00:15:00:02", 2)
        + &server_and_claim("iso-uefi", "52:54:00:15:00:03", 3);
    lab.cli(&["apply", "-f", "-"], Some(&yaml));
    let mut boot_ids = Vec::new();
    for claim in ["iso-generic-claim", "iso-signed-claim"] {
        let t0 = Instant::now();
        loop {
            let s = lab.sbc(claim);
            if s["status"]["state"] == "Ready" {
                // The boot id the index holds: the configuration's UID and generation
                // and the Server's boot generation.
                let server = claim.trim_end_matches("-claim");
                let sv: Value =
                    serde_json::from_str(&lab.cli(&["get", "server", server, "-o", "json"], None))
                        .unwrap();
                boot_ids.push(bootplane::controller::powerstate::claimed_boot_id(
                    &bootplane::model::views::read(&sv),
                    &bootplane::model::views::read(&s),
                ));
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{claim} not Ready: {s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // The per-machine URL, minted as BootHttp::signed_boot_url does.
    let key = std::fs::read(lab.path("state/http-token-key")).unwrap();
    let signer = bootplane::http::token::TokenSigner::new(&key);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = signer.mint(
        bootplane::http::token::Purpose::BootIso,
        "iso-signed",
        &boot_ids[1],
        now,
        600,
    );
    let base = format!("http://{NET}.1:8080");
    let (generic, signed) = (lab.path("generic.iso"), lab.path("signed.iso"));
    lab.download(&format!("{base}/boot.iso"), &generic);
    lab.download(
        &format!("{base}/ipxe/boot.iso?server=iso-signed&token={token}"),
        &signed,
    );
    // A script token does not fetch the ISO.
    let out = run_for(
        lab.ns.cmd("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{base}/ipxe/boot.iso?server=iso-signed&token=1.AAAA"),
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(text(&out).trim(), "403");

    let t0 = Instant::now();
    lab.boot("tapg", "52:54:00:15:00:01", &generic, false);
    // Registered for no Server: only the signed URL in its ISO can name it.
    lab.boot("taps", "52:54:00:15:00:99", &signed, false);
    // UEFI: the ISO's EFI entry starts ipxe.efi, which boots through bootplane's DHCP.
    lab.boot("tapu", "52:54:00:15:00:03", &generic, true);
    let limit = Duration::from_secs(300);
    let mut pending = vec!["iso-generic", "iso-signed", "iso-uefi"];
    while !pending.is_empty() {
        pending.retain(|server| {
            let s = lab.sbc(&format!("{server}-claim"));
            if condition_true(&s, "IPXEScriptFetched") {
                eprintln!(
                    "{server}: script fetched {:.1?} after QEMU started",
                    t0.elapsed()
                );
                false
            } else {
                true
            }
        });
        if t0.elapsed() > limit {
            let serial = |t: &str| read(&lab.path(&format!("{t}.serial")));
            panic!(
                "{pending:?}: no IPXEScriptFetched within {limit:?}\n--- tapg ---\n{}\n--- taps ---\n{}\n--- tapu ---\n{}\n--- qemu ---\n{}{}{}\n--- bootplane ---\n{}",
                serial("tapg"),
                serial("taps"),
                serial("tapu"),
                read(&lab.path("tapg.qemu.log")),
                read(&lab.path("taps.qemu.log")),
                read(&lab.path("tapu.qemu.log")),
                tail(&lab.log(), 80)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = lab.log();
    assert!(log.contains("path=/boot.ipxe"), "{}", tail(&log, 80));
    let access = |server: &str| {
        script_fetch_by(&log, server)
            .unwrap_or_else(|| panic!("no script fetch by {server} in:\n{}", tail(&log, 80)))
    };
    let (g, s, u) = (
        access("iso-generic"),
        access("iso-signed"),
        access("iso-uefi"),
    );
    eprintln!("{g}\n{s}\n{u}");
    // Nothing was network-booted by the firmware itself: iPXE came from the CDs.
    assert!(!log.contains("path=/assets/ipxe.efi"), "{}", tail(&log, 80));
    let serial = read(&lab.path("tapu.serial"));
    assert!(serial.contains("iPXE"), "UEFI console: {serial}");
    // Kill the VMs now (also done by Drop on failure).
    for vm in &mut lab.vms {
        vm.kill9();
    }
}
