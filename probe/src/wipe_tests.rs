//! Unit tests of `bootplane probe wipe`: arguments, the report's JSON, and both policies
//! on regular files (disk images; the block-device paths are tested on loop devices in
//! tests/it/probe_wipe.rs).

use super::*;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn arguments() {
    let a = parse_args(&s(&[
        "--device",
        "/dev/vda",
        "--device=/dev/vdb",
        "--policy",
        "full",
        "--report=http://h:1/w",
        "--deadline",
        "30",
        "--poweroff",
    ]))
    .unwrap();
    assert_eq!(
        a.devices,
        vec![PathBuf::from("/dev/vda"), PathBuf::from("/dev/vdb")]
    );
    assert_eq!(a.policy, Some(Policy::Full));
    assert_eq!(a.report.as_deref(), Some("http://h:1/w"));
    assert_eq!((a.deadline, a.poweroff, a.all), (Some(30), true, false));
    let a = parse_args(&s(&["--all", "--policy=metadata"])).unwrap();
    assert!(a.all);
    assert_eq!(a.policy, Some(Policy::Metadata));
    for bad in [
        &["--policy", "shred"][..],
        &["--device"],
        &["--all", "--device", "/dev/x"],
        &["--deadline", "soon"],
        &["--force-mounted"],
        &["--all=1"],
    ] {
        assert!(parse_args(&s(bad)).is_err(), "{bad:?}");
    }
    assert_eq!(run(&s(&["--policy", "shred", "--all"])), 2);
    assert_eq!(run(&s(&["--help"])), 0);
}

#[test]
fn report_json_shape() {
    let mut d = DiskWipe::new("/dev/vda".into());
    d.method = Some(Method::DiscardZeroout);
    d.verified = true;
    let r = WipeReport {
        action: "wipe".into(),
        policy: Policy::Full,
        ok: true,
        system_uuid: "u".into(),
        disks: vec![d],
        error: None,
    };
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(v["policy"], "full");
    assert_eq!(v["systemUUID"], "u");
    assert_eq!(v["disks"][0]["method"], "discard+zeroout");
    assert_eq!(v["disks"][0]["sizeBytes"], 0);
    assert_eq!(v["disks"][0]["bytesVerified"], 0);
    assert!(v["disks"][0]["error"].is_null());
    assert!(v["disks"][0].get("firstNonzeroOffset").is_none());
    let back: WipeReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
    for (m, s) in [
        (Method::ZeroRanges, "zero-ranges"),
        (Method::PunchHole, "punch-hole"),
        (Method::NvmeFormat, "nvme-format"),
        (Method::Zeroout, "zeroout"),
    ] {
        assert_eq!(serde_json::to_value(m).unwrap(), s);
    }
}

#[test]
fn deadline_stops_the_clock() {
    let c = Clock::new(Some(Duration::ZERO));
    std::thread::sleep(Duration::from_millis(5));
    assert!(c.check().unwrap_err().contains("deadline"));
    assert!(Clock::new(None).check().is_ok());
}

/// A temporary file with bytes everywhere, removed on drop.
struct Image(PathBuf);

impl Image {
    fn new(tag: &str, size: usize) -> Image {
        let p = std::env::temp_dir().join(format!("bootplane-wipe-{tag}-{}", std::process::id()));
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 | 1).collect();
        std::fs::write(&p, data).unwrap();
        Image(p)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn metadata_on_a_file_zeroes_the_ends_only() {
    let size = 5 * 1024 * 1024 + 1000; // not a multiple of the sector
    let img = Image::new("meta", size);
    let (r, code) = wipe(
        std::slice::from_ref(&img.0),
        false,
        Policy::Metadata,
        &Clock::new(None),
    );
    assert_eq!(code, 0, "{r:?}");
    let d = &r.disks[0];
    assert!(r.ok && d.verified && d.error.is_none());
    assert_eq!(d.method, Some(Method::ZeroRanges));
    assert_eq!(d.size_bytes, size as u64);
    let data = std::fs::read(&img.0).unwrap();
    assert_eq!(data.len(), size);
    assert!(data[..1 << 20].iter().all(|&b| b == 0));
    assert!(data[size - (1 << 20)..].iter().all(|&b| b == 0));
    assert!(
        data[(2 << 20)..(3 << 20)].iter().all(|&b| b != 0),
        "the middle is kept"
    );
    assert_eq!(d.bytes_verified, d.bytes_written);
}

#[test]
fn full_on_a_file_zeroes_everything() {
    let size = 3 * 1024 * 1024 + 512;
    let img = Image::new("full", size);
    let (r, code) = wipe(
        std::slice::from_ref(&img.0),
        false,
        Policy::Full,
        &Clock::new(None),
    );
    assert_eq!(code, 0, "{r:?}");
    let d = &r.disks[0];
    assert!(d.verified);
    assert!(matches!(
        d.method,
        Some(Method::PunchHole) | Some(Method::Overwrite)
    ));
    assert_eq!(d.bytes_verified, size as u64);
    let data = std::fs::read(&img.0).unwrap();
    assert_eq!(data.len(), size);
    assert!(data.iter().all(|&b| b == 0));
}

#[test]
fn refusals_write_nothing() {
    let img = Image::new("refuse", 4096);
    let missing = PathBuf::from("/nonexistent/bootplane-wipe");
    let (r, code) = wipe(
        &[img.0.clone(), missing],
        false,
        Policy::Full,
        &Clock::new(None),
    );
    assert_eq!(code, 2);
    assert!(!r.ok);
    assert!(r.error.as_deref().unwrap().starts_with("refused"));
    assert!(std::fs::read(&img.0).unwrap().iter().all(|&b| b != 0));
    let (_, code) = wipe(
        &[PathBuf::from("/dev/null")],
        false,
        Policy::Full,
        &Clock::new(None),
    );
    assert_eq!(code, 2, "a character device is refused");
}

#[test]
fn nonzero_finds_the_first() {
    let mut b = vec![0u8; 1000];
    assert_eq!(blockdev::nonzero(&b), None);
    b[999] = 1;
    assert_eq!(blockdev::nonzero(&b), Some(999));
    b[65] = 2;
    assert_eq!(blockdev::nonzero(&b), Some(65));
    b[0] = 3;
    assert_eq!(blockdev::nonzero(&b), Some(0));
    assert_eq!(blockdev::nonzero(&[]), None);
}

#[test]
fn nvme_names() {
    let k = |n: &str| blockdev::Kind::Block {
        sysfs: PathBuf::new(),
        name: n.into(),
    };
    assert_eq!(blockdev::nvme_namespace(&k("nvme0n1")), Some("nvme0n1"));
    assert_eq!(blockdev::nvme_namespace(&k("nvme0n1p1")), None);
    assert_eq!(blockdev::nvme_namespace(&k("nvme0")), None);
    assert_eq!(blockdev::nvme_namespace(&k("vda")), None);
    assert_eq!(blockdev::nvme_namespace(&blockdev::Kind::File), None);
}
