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
//!
//! The lab, the scenario runner, the kernel and the initramfs are `tests/support/qemu.rs`
//! (shared with tests/e2e_cluster.rs).

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::bootplane::ipxe_templates;
use support::image::{tiny_ipxe_image, write_catalog};
use support::process::*;
use support::qemu::*;
use support::require::*;

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

#[test]
fn bios_tftp_undionly_chain() {
    require_all();
    let mut lab = QemuLab::new(61);
    let images = lab.path("images");
    tiny_ipxe_image(&images, "bootplane-e2e: kernel image running");
    // The ROM's iPXE chains undionly.kpxe from TFTP; iPXE running on the UNDI driver
    // (the chained one) goes on to the machine's script.
    let t = ipxe_templates(lab.dir.path(), &[("boot.ipxe.j2", UNDIONLY_CHAIN_BOOT)]);
    lab.start(&images, &t);
    run_scenario(
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
    run_scenario(
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
    run_scenario(
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
    run_scenario(
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
