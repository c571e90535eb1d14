//! Unit tests of `bootplane probe install`'s arguments, the kernel command line, the
//! report and the boot partition's label reader.

use super::*;
use crate::bootpart::{fs_label, pick, Partition};

fn args(v: &[&str]) -> Result<Args, String> {
    parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

#[test]
fn parses_flags_and_refuses_conflicts() {
    let a = args(&[
        "--image=http://h/i.img",
        "--sha256",
        "ab",
        "--root-device-hints",
        r#"{"size":"== 1"}"#,
        "--candidate",
        "/dev/loop0",
        "--candidate=/dev/loop1",
        "--ignition",
        "/tmp/c.ign",
        "--deadline",
        "60",
        "--reboot",
    ])
    .unwrap();
    assert_eq!(a.image.as_deref(), Some("http://h/i.img"));
    assert_eq!(a.candidates.len(), 2);
    assert_eq!(a.deadline, Some(60));
    assert!(a.reboot && !a.poweroff);
    for bad in [
        &["--device", "/dev/sda", "--root-device-hints", "{}"][..],
        &["--reboot", "--poweroff"],
        &["--deadline", "soon"],
        &["--image"],
        &["--frobnicate"],
        &["--reboot=yes"],
    ] {
        assert!(args(bad).is_err(), "{bad:?}");
    }
    assert_eq!(args(&["--help"]), Err(String::new()));
}

#[test]
fn kernel_command_line_fills_what_the_flags_leave_out() {
    let cmdline = "console=ttyS0 bootplane.install=http://b/r bootplane.image=http://b/i.img \
                   bootplane.image_sha256=cd bootplane.root_hints=%7B%22size%22%3A%22%3E%3D%2010%22%7D \
                   bootplane.ignition=http://b/c.ign";
    let a = with_cmdline(Args::default(), cmdline).unwrap();
    assert_eq!(a.report.as_deref(), Some("http://b/r"));
    assert_eq!(a.image.as_deref(), Some("http://b/i.img"));
    assert_eq!(a.sha256.as_deref(), Some("cd"));
    assert_eq!(a.hints.as_deref(), Some(r#"{"size":">= 10"}"#));
    assert_eq!(a.ignition.as_deref(), Some("http://b/c.ign"));
    // A flag wins, and --device keeps the command line's hints out.
    let a = with_cmdline(
        args(&["--image", "/x", "--device", "/dev/vdb"]).unwrap(),
        cmdline,
    )
    .unwrap();
    assert_eq!((a.image.as_deref(), a.hints), (Some("/x"), None));
    assert!(percent_decode("%7").is_err());
    assert!(percent_decode("%zz").is_err());
    assert!(percent_decode("%ff").is_err());
}

#[test]
fn report_is_camel_case_and_round_trips() {
    let mut r = InstallReport::new("http://b/i.img".into());
    r.system_uuid = "4c4c4544-0000".into();
    r.device = Some("/dev/sda".into());
    r.chosen_by = vec!["size 1 GiB == 1".into()];
    r.ignition = Some(IgnitionWritten {
        partition: "/dev/sda3".into(),
        found_by: "label boot".into(),
        path: "ignition/config.ign".into(),
        bytes: 42,
    });
    let v = serde_json::to_value(&r).unwrap();
    for k in [
        "action",
        "ok",
        "systemUUID",
        "device",
        "chosenBy",
        "image",
        "sha256",
        "verified",
        "bytesWritten",
        "resumedFrom",
        "seconds",
        "ignition",
        "error",
    ] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
    assert_eq!(v["ignition"]["foundBy"], "label boot");
    assert_eq!(v["action"], "install");
    let back: InstallReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
}

fn part(n: u32, partname: Option<&str>, label: Option<&str>, esp: bool) -> Partition {
    Partition {
        dev: format!("/dev/vda{n}"),
        number: n,
        partname: partname.map(str::to_string),
        fstype: Some(if esp { "vfat" } else { "ext4" }),
        label: label.map(str::to_string),
        esp,
    }
}

#[test]
fn boot_partition_by_name_then_label_then_esp() {
    let esp = part(1, Some("EFI-SYSTEM"), None, true);
    let by_label = part(2, None, Some("boot"), false);
    let by_name = part(3, Some("boot"), Some("x"), false);
    let all = vec![esp.clone(), by_label.clone(), by_name.clone()];
    assert_eq!(pick(&all).unwrap(), (&by_name, "partlabel boot"));
    assert_eq!(pick(&all[..2]).unwrap(), (&by_label, "label boot"));
    assert_eq!(pick(&all[..1]).unwrap(), (&esp, "esp"));
    let e = pick(&[part(4, Some("root"), Some("root"), false)]).unwrap_err();
    assert!(
        e.contains("/dev/vda4 (partname \"root\", ext4 label \"root\")"),
        "{e}"
    );
    assert!(pick(&[]).unwrap_err().ends_with("none"));
}

#[test]
fn reads_ext4_and_fat_labels() {
    let mut ext = vec![0u8; 4096];
    ext[1024 + 56..1024 + 58].copy_from_slice(&[0x53, 0xef]);
    ext[1024 + 120..1024 + 124].copy_from_slice(b"boot");
    assert_eq!(fs_label(&ext), Some(("ext4", Some("boot".to_string()))));
    let mut fat = vec![0u8; 512];
    fat[510..].copy_from_slice(&[0x55, 0xaa]);
    fat[82..87].copy_from_slice(b"FAT32");
    fat[71..82].copy_from_slice(b"EFI-SYSTEM ");
    assert_eq!(
        fs_label(&fat),
        Some(("vfat", Some("EFI-SYSTEM".to_string())))
    );
    fat[71..82].copy_from_slice(b"NO NAME    ");
    assert_eq!(fs_label(&fat), Some(("vfat", None)));
    assert_eq!(fs_label(&[0u8; 100]), None);
}

#[test]
fn reads_gpt_entries_names_and_the_esp_type() {
    use crate::bootpart::gpt_entries;
    let p = std::env::temp_dir().join(format!("bootplane-gpt-{}.img", std::process::id()));
    let mut disk = vec![0u8; 64 << 10];
    let h = &mut disk[512..1024];
    h[..8].copy_from_slice(b"EFI PART");
    h[72..80].copy_from_slice(&2u64.to_le_bytes());
    h[80..84].copy_from_slice(&4u32.to_le_bytes());
    h[84..88].copy_from_slice(&128u32.to_le_bytes());
    let mut entry = |i: usize, ty: [u8; 16], first: u64, last: u64, name: &str| {
        let e = &mut disk[1024 + i * 128..][..128];
        e[..16].copy_from_slice(&ty);
        e[32..40].copy_from_slice(&first.to_le_bytes());
        e[40..48].copy_from_slice(&last.to_le_bytes());
        for (k, u) in name.encode_utf16().enumerate() {
            e[56 + 2 * k..58 + 2 * k].copy_from_slice(&u.to_le_bytes());
        }
    };
    let esp = [
        0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9,
        0x3b,
    ];
    entry(0, esp, 2048, 4095, "EFI-SYSTEM");
    entry(2, [7; 16], 4096, 8191, "boot");
    std::fs::write(&p, &disk).unwrap();
    let got = gpt_entries(&p, 512);
    let _ = std::fs::remove_file(&p);
    let view: Vec<_> = got
        .iter()
        .map(|e| (e.number, e.esp, e.name.as_str(), e.start, e.len))
        .collect();
    assert_eq!(
        view,
        vec![
            (1, true, "EFI-SYSTEM", 2048 * 512, 2048 * 512),
            (3, false, "boot", 4096 * 512, 4096 * 512)
        ]
    );
    // No GPT, or an entry size out of bounds: nothing.
    disk[512 + 84..512 + 88].copy_from_slice(&8192u32.to_le_bytes());
    std::fs::write(&p, &disk).unwrap();
    assert!(gpt_entries(&p, 512).is_empty());
    std::fs::write(&p, vec![0u8; 4096]).unwrap();
    assert!(gpt_entries(&p, 512).is_empty());
    let _ = std::fs::remove_file(&p);
}
