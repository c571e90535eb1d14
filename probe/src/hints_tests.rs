//! Unit tests of the root device hints parser and matcher.

use super::*;

const GIB: u64 = 1 << 30;

fn disk(path: &str, gib: u64) -> DiskFacts {
    DiskFacts {
        path: path.into(),
        size_bytes: gib * GIB + 4096,
        ..Default::default()
    }
}

fn sda() -> DiskFacts {
    DiskFacts {
        wwn: Some("naa.5000c500a1b2c3d4".into()),
        serial: Some("S3Z9NB0K123456".into()),
        vendor: Some("ATA     ".into()),
        model: Some("Samsung SSD 860 ".into()),
        rotational: Some(false),
        by_path: vec!["/dev/disk/by-path/pci-0000:00:1f.2-ata-1".into()],
        ..disk("/dev/sda", 500)
    }
}

fn parse(s: &str) -> Result<Hints, String> {
    Hints::parse(s.as_bytes())
}

#[test]
fn parses_every_key_and_ironic_size_operators() {
    let h = parse(
        r#"{"name":"/dev/sda","wwn":"0x5000c500a1b2c3d4","serial":"S3Z9NB0K123456",
            "vendor":"ata","model":"samsung","size":">= 100","rotational":false,
            "by_path":"/dev/disk/by-path/pci-0000:00:1f.2-ata-1"}"#,
    )
    .unwrap();
    assert_eq!(
        h.size,
        Some(SizeHint {
            op: Op::Ge,
            gib: 100
        })
    );
    assert_eq!(check(&sda(), &h).unwrap().len(), 8);
    for (s, op, gib) in [
        ("10", Op::Eq, 10),
        ("== 1", Op::Eq, 1),
        ("!=3", Op::Ne, 3),
        ("<= 7", Op::Le, 7),
        ("> 0", Op::Gt, 0),
        ("<2", Op::Lt, 2),
    ] {
        let h = parse(&format!(r#"{{"size":"{s}"}}"#)).unwrap();
        assert_eq!(h.size, Some(SizeHint { op, gib }), "{s}");
    }
    assert_eq!(
        parse(r#"{"size":42}"#).unwrap().size,
        Some(SizeHint {
            op: Op::Eq,
            gib: 42
        })
    );
}

#[test]
fn refuses_unknown_keys_bad_values_and_oversized_documents() {
    for bad in [
        "",
        "[]",
        "{}",
        r#"{"name":null}"#,
        r#"{"nmae":"/dev/sda"}"#,
        r#"{"size":"about 10"}"#,
        r#"{"size":">= "}"#,
        r#"{"size":-1}"#,
        r#"{"size":1.5}"#,
        r#"{"size":"=< 3"}"#,
        r#"{"rotational":"yes"}"#,
        r#"{"serial":""}"#,
        r#"{"serial":"a\nb"}"#,
        r#"{"name":"/dev/sda"} trailing"#,
    ] {
        assert!(parse(bad).is_err(), "{bad:?} was accepted");
    }
    let long = format!(r#"{{"serial":"{}"}}"#, "x".repeat(MAX_HINTS));
    let e = parse(&long).unwrap_err();
    assert!(e.contains("at most 4096"), "{e}");
    let e = parse(&format!(r#"{{"serial":"{}"}}"#, "x".repeat(300))).unwrap_err();
    assert!(e.starts_with("serial hint"), "{e}");
}

#[test]
fn every_hint_must_match_and_mismatches_are_named() {
    let h = parse(r#"{"serial":"S3Z9NB0K123456","rotational":true,"size":"< 100"}"#).unwrap();
    let why = check(&sda(), &h).unwrap_err();
    assert_eq!(
        why,
        vec![
            "size 500 GiB < 100 does not hold".to_string(),
            "rotational is false, not true".to_string()
        ]
    );
    let h = parse(r#"{"wwn":"NAA.5000C500A1B2C3D4","vendor":"ata"}"#).unwrap();
    assert!(check(&sda(), &h).is_ok());
    let h = parse(r#"{"serial":"x"}"#).unwrap();
    assert_eq!(
        check(&disk("/dev/loop0", 1), &h).unwrap_err(),
        vec!["serial: the disk has none (want \"x\")".to_string()]
    );
    // The name hint also matches a by-path link.
    let h = parse(r#"{"name":"/dev/disk/by-path/pci-0000:00:1f.2-ata-1"}"#).unwrap();
    assert!(check(&sda(), &h).is_ok());
}

#[test]
fn choose_wants_exactly_one_disk() {
    let disks = vec![sda(), disk("/dev/vdb", 1), disk("/dev/vdc", 2)];
    let (i, why) = choose(&disks, &parse(r#"{"size":"== 1"}"#).unwrap()).unwrap();
    assert_eq!((i, why), (1, vec!["size 1 GiB == 1".to_string()]));
    let e = choose(&disks, &parse(r#"{"size":"<= 2"}"#).unwrap()).unwrap_err();
    assert!(
        e.starts_with("2 disks match the root device hints, want exactly one"),
        "{e}"
    );
    assert!(
        e.contains("/dev/vdb (size 1 GiB <= 2)") && e.contains("/dev/vdc"),
        "{e}"
    );
    let e = choose(&disks, &parse(r#"{"size":"> 1000"}"#).unwrap()).unwrap_err();
    assert!(
        e.starts_with("no disk matches the root device hints"),
        "{e}"
    );
    for d in ["/dev/sda", "/dev/vdb", "/dev/vdc"] {
        assert!(e.contains(d), "{e}");
    }
    let e = choose(&[], &parse(r#"{"size":1}"#).unwrap()).unwrap_err();
    assert_eq!(e, "no candidate disk found");
}
