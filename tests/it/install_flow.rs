//! A claim on a disk image (`[[disk]]` in the catalog) through the real `bootplane serve`
//! and the real agent (`bootplane probe install`) on a loop device: the boot side serves
//! the install script (the agent image, the disk image's URL, its pinned SHA-256, the
//! root-device hints and a signed Ignition URL); the agent, following it, writes the image
//! on the disk the hints choose and the claim's Ignition into its `boot` partition, and
//! reports; the boot configuration turns `Installed` and the machine is then told to boot
//! its disk. A disk image that does not hash to its pin fails cleanly (the disk's first
//! MiB zero, the boot configuration in `Error` saying why), and bad reports are refused.
//!
//! The machine is a registered Server (the test power driver stands in for its BMC); the
//! agent runs on this host in a mount namespace whose `/sys/class/dmi/id/product_uuid` is
//! the Server's UUID (as in `cleanup_flow`), against a loop device named as its only
//! candidate.

use crate::probe_wipe::{Backing, Loop};
use crate::support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};
use support::api::{claim, claims, condition, sbcs, server_at, SERVERS};
use support::bootplane::Bootplane;
use support::process::tool;
use support::require::require_tools;

const RENDER: &str = "/apis/boot.bootplane.dev/v1alpha1/render/ipxe";
const MIB: u64 = 1 << 20;
pub(crate) const IGNITION: &str = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/installed-by","contents":{"source":"data:,bootplane"}}]}}"#;

/// A 64 MiB raw disk image: GPT with an ESP and an ext4 partition named and labelled
/// `boot` holding a marker file; packed with the real `bootplane image pack` into the
/// catalog directory as `disk/disk.img.zst` (+ manifest). The raw image and its SHA-256.
pub(crate) fn disk_image(images: &Path, test: &str) -> (Backing, String) {
    require_tools(&["sgdisk", "mkfs.ext4", "mkfs.vfat", "losetup"]);
    let raw = Backing::new(&format!("install-{test}-raw"), 64 * MIB);
    let f = raw.0.to_str().unwrap();
    tool(
        "sgdisk",
        &[
            "--zap-all",
            "-n1:1MiB:+16MiB",
            "-t1:ef00",
            "-c1:esp",
            "-n2:0:0",
            "-t2:8300",
            "-c2:boot",
            f,
        ],
    );
    let lp = Loop::new(&raw, false);
    let _ = Command::new("partx").args(["-u", &lp.dev]).status();
    for _ in 0..100 {
        if Path::new(&format!("{}p2", lp.dev)).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    tool("mkfs.vfat", &[&format!("{}p1", lp.dev)]);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-L", "boot", &format!("{}p2", lp.dev)],
    );
    drop(lp);
    std::fs::create_dir_all(images.join("disk")).unwrap();
    let out = images.join("disk/disk.img.zst");
    let o = support::process::run_cmd(
        Command::new(env!("CARGO_BIN_EXE_bootplane")).args([
            "image",
            "pack",
            f,
            "-o",
            out.to_str().unwrap(),
        ]),
        120,
    );
    assert!(
        o.status.success(),
        "image pack: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m: Value = serde_json::from_slice(
        &std::fs::read(images.join("disk/disk.img.zst.manifest.json")).unwrap(),
    )
    .unwrap();
    (raw, m["sha256"].as_str().unwrap().to_string())
}

/// Add the disk image `ref` (pinned to `sha256`) to the catalog and reload it.
fn catalog_disk(b: &Bootplane, sha256: &str) {
    let cat = b.images_dir().join("catalog.toml");
    let mut text = std::fs::read_to_string(&cat).unwrap();
    text.push_str(&format!(
        "\n[[disk]]\nref = \"deb:disk\"\npath = \"disk/disk.img.zst\"\nsha256 = \"{sha256}\"\nroot_device_hints = {{ size = \"== 0\" }}\n"
    ));
    std::fs::write(&cat, text).unwrap();
    b.reload();
}

fn start() -> Bootplane {
    Bootplane::start(&[
        "--set",
        "cleanup.image=\"os-image:latest\"",
        "--set",
        "cleanup.policy=\"none\"",
    ])
}

/// Register `name` (not on loopback: the agent proves itself with its URL's token) and
/// claim it on the disk image with an Ignition secret; its UUID once the boot
/// configuration is Ready.
fn claimed(b: &Bootplane, name: &str, mac: &str, ip: &str) -> String {
    let s = server_at(name, mac, ip);
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 201, "{v}");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-ign"), "namespace": "default"},
        "stringData": {"ignition": IGNITION}});
    let (c, v) = b.call("POST", "/api/v1/namespaces/default/secrets", Some(&secret));
    assert_eq!(c, 201, "{v}");
    let mut cl = claim(name, None, Some(name));
    cl["spec"]["image"] = json!("deb:disk");
    cl["spec"]["ignitionSecretRef"] = json!({"name": format!("{name}-ign")});
    let (c, v) = b.call("POST", &claims("default"), Some(&cl));
    assert_eq!(c, 201, "{v}");
    b.wait_for(30, &format!("{name}'s boot configuration Ready"), || {
        let (c, v) = b.call("GET", &format!("{}/{name}", sbcs("default")), None);
        (c == 200 && v["status"]["state"] == "Ready").then_some(())
    });
    s["spec"]["systemUUID"].as_str().unwrap().to_string()
}

fn script(b: &Bootplane, name: &str) -> String {
    b.req("GET", &format!("{RENDER}/{name}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

fn arg<'a>(script: &'a str, key: &str) -> &'a str {
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in\n{script}"))
}

/// The real agent, `bootplane probe install ARGS`, on a machine whose SMBIOS UUID is
/// `uuid` ([`crate::cleanup_flow::agent_as`]).
fn agent(uuid: &str, args: &[&str]) -> Output {
    crate::cleanup_flow::agent_as(uuid, "install", args)
}

/// The agent as the install script tells it, its disk being `dev` (the only candidate).
fn install_as_told(uuid: &str, script: &str, dev: &str) -> Output {
    let hints = percent_encoding::percent_decode_str(arg(script, "bootplane.root_hints="))
        .decode_utf8()
        .unwrap()
        .to_string();
    agent(
        uuid,
        &[
            "--image",
            arg(script, "bootplane.image="),
            "--sha256",
            arg(script, "bootplane.image_sha256="),
            "--root-device-hints",
            &hints,
            "--candidate",
            dev,
            "--ignition",
            arg(script, "bootplane.ignition="),
            "--report",
            arg(script, "bootplane.install="),
            "--deadline",
            "120",
        ],
    )
}

fn explain(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn sbc(b: &Bootplane, name: &str) -> Value {
    b.get(&format!("{}/{name}", sbcs("default")))
}

#[test]
fn a_claim_on_a_disk_image_is_installed_by_the_agent_and_then_boots_its_disk() {
    let b = start();
    let (raw, sha) = disk_image(&b.images_dir(), "ok");
    catalog_disk(&b, &sha);
    let uuid = claimed(&b, "inst-a", "52:54:00:c2:00:01", "10.98.0.1");
    let s = b.wait_for(30, "the install script", || {
        let s = script(&b, "inst-a");
        s.contains("bootplane.install=").then_some(s)
    });
    assert_eq!(arg(&s, "bootplane.image_sha256="), sha);
    assert!(
        arg(&s, "bootplane.image=").ends_with("/assets/images/disk/disk.img.zst"),
        "{s}"
    );
    // The machine's disk: 128 MiB of a previous tenant's bytes.
    let disk = Backing::new("install-ok-disk", 128 * MIB);
    std::fs::write(&disk.0, vec![0xa5u8; (128 * MIB) as usize]).unwrap();
    let lp = Loop::new(&disk, false);
    let o = install_as_told(&uuid, &s, &lp.dev);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let b2 = b.wait_for(30, "Installed", || {
        let v = sbc(&b, "inst-a");
        (v["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Installed" && c["status"] == "True"))
        .then_some(v)
    });
    let c = condition(&b2, "Installed");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains(&lp.dev) && msg.contains(&sha) && msg.contains("Ignition in"),
        "{msg}"
    );
    assert_eq!(b2["status"]["state"], "Ready", "{b2}");
    assert_eq!(
        event(&b, ("ServerBootConfiguration", "inst-a"), "Installed"),
        "Normal"
    );
    // Now the machine is told to boot its disk.
    let s = b.wait_for(30, "the local boot script", || {
        let s = script(&b, "inst-a");
        (!s.contains("bootplane.install=")).then_some(s)
    });
    assert!(s.contains("exit") && s.contains("booting from disk"), "{s}");
    // From the host: the device holds the raw image (its tables, the ESP and the backup
    // GPT byte for byte; the boot partition gained the Ignition), and the Ignition.
    let want = std::fs::read(&raw.0).unwrap();
    let got = std::fs::read(&disk.0).unwrap();
    let esp_end = (17 * MIB) as usize;
    let tail = want.len() - 34 * 512;
    assert!(
        got[..esp_end] == want[..esp_end],
        "the device's tables and ESP differ from the image"
    );
    assert!(
        got[tail..want.len()] == want[tail..],
        "the device's backup GPT differs from the image"
    );
    let _ = Command::new("partx").args(["-u", &lp.dev]).status();
    let dump = tool(
        "debugfs",
        &["-R", "cat /ignition/config.ign", &format!("{}p2", lp.dev)],
    );
    assert_eq!(
        String::from_utf8_lossy(&dump.stdout).trim(),
        IGNITION.trim()
    );
    assert_eq!(
        metric(
            &b,
            "bootplane_http_discovery_install_total{result=\"accepted\"}"
        ),
        1.0
    );
}

#[test]
fn an_image_that_does_not_hash_to_its_pin_leaves_no_bootable_disk_and_says_why() {
    let b = start();
    let (_raw, sha) = disk_image(&b.images_dir(), "bad");
    catalog_disk(&b, &sha);
    // The packed image is damaged after it was catalogued (a byte in its last frame).
    let packed = b.images_dir().join("disk/disk.img.zst");
    let mut data = std::fs::read(&packed).unwrap();
    let at = data.len() / 2;
    data[at] ^= 0xff;
    std::fs::write(&packed, data).unwrap();
    let uuid = claimed(&b, "inst-b", "52:54:00:c2:00:02", "10.98.0.2");
    let s = b.wait_for(30, "the install script", || {
        let s = script(&b, "inst-b");
        s.contains("bootplane.install=").then_some(s)
    });
    let disk = Backing::new("install-bad-disk", 128 * MIB);
    std::fs::write(&disk.0, vec![0xa5u8; (128 * MIB) as usize]).unwrap();
    let lp = Loop::new(&disk, false);
    let o = install_as_told(&uuid, &s, &lp.dev);
    assert_eq!(o.status.code(), Some(1), "{}", explain(&o));
    let v = b.wait_for(30, "InstallFailed", || {
        let v = sbc(&b, "inst-b");
        (v["status"]["state"] == "Error").then_some(v)
    });
    let c = condition(&v, "Ready");
    assert_eq!(c["reason"], "InstallFailed", "{v}");
    assert!(
        c["message"].as_str().unwrap().contains("does not boot"),
        "{c}"
    );
    assert_eq!(
        event(&b, ("ServerBootConfiguration", "inst-b"), "InstallFailed"),
        "Warning"
    );
    // The disk does not look bootable: its first MiB is zero.
    let got = std::fs::read(&disk.0).unwrap();
    assert!(
        got[..MIB as usize].iter().all(|b| *b == 0),
        "the first MiB was written"
    );
    // It stays in Error (the reconciler does not turn it Ready again).
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(sbc(&b, "inst-b")["status"]["state"], "Error");
}

#[test]
fn bad_install_reports_are_refused_and_counted() {
    let b = start();
    let (_raw, sha) = disk_image(&b.images_dir(), "refuse");
    catalog_disk(&b, &sha);
    let uuid = claimed(&b, "inst-c", "52:54:00:c2:00:03", "10.98.0.3");
    let s = b.wait_for(30, "the install script", || {
        let s = script(&b, "inst-c");
        s.contains("bootplane.install=").then_some(s)
    });
    let url = arg(&s, "bootplane.install=").to_string();
    let good = json!({"action": "install", "ok": true, "systemUUID": uuid, "device": "/dev/vda",
        "chosenBy": ["size 0 GiB == 0"], "image": "x", "sha256": sha, "verified": true,
        "bytesWritten": 1, "resumedFrom": 0, "seconds": 1.0, "ignition": null, "error": null});
    let mut other = good.clone();
    other["sha256"] = json!("00".repeat(32));
    let mut stranger = good.clone();
    stranger["systemUUID"] = json!("5a2c0000-0000-4000-8000-0000000000fe");
    let mut unverified = good.clone();
    unverified["verified"] = json!(false);
    let forged = format!("{}/AAAAforged", url.rsplit_once('/').unwrap().0);
    for (u, body, want) in [
        (forged.as_str(), good.to_string(), 403),
        (url.as_str(), other.to_string(), 409),
        (url.as_str(), stranger.to_string(), 409),
        (url.as_str(), unverified.to_string(), 422),
        (url.as_str(), "[]".to_string(), 400),
    ] {
        let (c, text) = post(u, &body);
        assert_eq!(c, want, "{u}: {text}");
    }
    for (result, n) in [
        ("forbidden", 1.0),
        ("conflict", 2.0),
        ("invalid", 1.0),
        ("malformed", 1.0),
    ] {
        let line = format!("bootplane_http_discovery_install_total{{result=\"{result}\"}}");
        assert_eq!(metric(&b, &line), n, "{line}");
    }
    // The Server's own root-device hints replace the catalog's; malformed ones are the
    // reason it is not served an install script.
    let annotate = |hints: &str| {
        let (c, v) = b.call(
            "PATCH",
            &format!("{SERVERS}/inst-c"),
            Some(&json!({"metadata": {"annotations": {"bootplane.dev/root-device-hints": hints}}})),
        );
        assert_eq!(c, 200, "{v}");
    };
    annotate(r#"{"serial": "DISK-7"}"#);
    b.wait_for(30, "the Server's hints in the script", || {
        let s = script(&b, "inst-c");
        s.contains("bootplane.root_hints=%7B%22serial%22%3A%22DISK%2D7%22%7D")
            .then_some(())
    });
    annotate(r#"{"colour": "red"}"#);
    b.wait_for(30, "the malformed hints named", || {
        let s = script(&b, "inst-c");
        (s.contains("bootplane.dev/root-device-hints") && s.contains("unknown hint")).then_some(())
    });
    let v = sbc(&b, "inst-c");
    assert!(
        !v["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Installed"),
        "{v}"
    );
}

/// Wait for an Event about `kind` `name` with `reason` (the recorder writes in batches);
/// its `type`.
pub(crate) fn event(b: &Bootplane, (kind, name): (&str, &str), reason: &str) -> String {
    b.wait_for(30, &format!("a {reason} Event for {kind} {name}"), || {
        let l = b.get(&format!(
            "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name}"
        ));
        l["items"].as_array()?.iter().find_map(|e| {
            (e["involvedObject"]["kind"] == kind && e["reason"] == reason)
                .then(|| e["type"].as_str().unwrap_or("").to_string())
        })
    })
}

fn post(url: &str, body: &str) -> (u16, String) {
    match ureq::post(url)
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

fn metric(b: &Bootplane, line_start: &str) -> f64 {
    let text = b
        .req("GET", "/metrics")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
