//! SMBIOS parser tests: tables built byte by byte (types 0/1/4/17, 2.x and 3.x entry
//! points), truncated, oversized and garbage input.

use super::*;

/// One structure: `formatted` excludes the 4-byte header; strings follow.
pub(crate) fn structure(kind: u8, handle: u16, formatted: &[u8], strings: &[&str]) -> Vec<u8> {
    let mut v = vec![kind, (formatted.len() + 4) as u8];
    v.extend_from_slice(&handle.to_le_bytes());
    v.extend_from_slice(formatted);
    if strings.is_empty() {
        v.extend_from_slice(&[0, 0]);
    } else {
        for s in strings {
            v.extend_from_slice(s.as_bytes());
            v.push(0);
        }
        v.push(0);
    }
    v
}

/// Formatted area of `len` bytes (after the header), with `sets` written at offsets
/// counted from the structure start (as the spec numbers them).
fn area(len: usize, sets: &[(usize, &[u8])]) -> Vec<u8> {
    let mut a = vec![0u8; len - 4];
    for (off, bytes) in sets {
        a[off - 4..off - 4 + bytes.len()].copy_from_slice(bytes);
    }
    a
}

const UUID_BYTES: [u8; 16] = [
    0x78, 0x56, 0x34, 0x12, 0x34, 0x12, 0x78, 0x56, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78,
];

/// A QEMU-like table: BIOS, system, two sockets (one empty), two DIMMs (one empty) and
/// one with an extended size.
pub(crate) fn sample_table() -> Vec<u8> {
    let mut t = Vec::new();
    t.extend(structure(
        0,
        0,
        &area(0x18, &[(0x04, &[1]), (0x05, &[2])]),
        &["SeaBIOS", "1.16.2"],
    ));
    t.extend(structure(
        1,
        0x100,
        &area(
            0x1b,
            &[
                (0x04, &[1]),
                (0x05, &[2]),
                (0x06, &[0]),
                (0x07, &[3]),
                (0x08, &UUID_BYTES),
                (0x19, &[4]),
            ],
        ),
        &["Acme", "Rack 9", "SN-42", "SKU-7"],
    ));
    let cpu = |status: u8, cores: u8, threads: u8, c2: u16, t2: u16| {
        area(
            0x30,
            &[
                (0x04, &[1]),
                (0x07, &[2]),
                (0x10, &[3]),
                (0x14, &2600u16.to_le_bytes()),
                (0x18, &[status]),
                (0x23, &[cores]),
                (0x25, &[threads]),
                (0x2a, &c2.to_le_bytes()),
                (0x2e, &t2.to_le_bytes()),
            ],
        )
    };
    t.extend(structure(
        4,
        0x400,
        &cpu(0x41, 8, 16, 8, 16),
        &["CPU 0", "GenuineIntel", "Xeon X"],
    ));
    t.extend(structure(4, 0x401, &cpu(0x00, 0, 0, 0, 0), &["CPU 1"]));
    // Extended counts: more than 255 cores.
    t.extend(structure(
        4,
        0x402,
        &cpu(0x41, 0xff, 0xff, 300, 600),
        &["CPU 2", "AMD", "EPYC"],
    ));
    let dimm = |size: u16, ext: u32| {
        area(
            0x28,
            &[(0x0c, &size.to_le_bytes()), (0x1c, &ext.to_le_bytes())],
        )
    };
    t.extend(structure(17, 0x1100, &dimm(1024, 0), &[]));
    t.extend(structure(17, 0x1101, &dimm(0, 0), &[]));
    t.extend(structure(17, 0x1102, &dimm(0x7fff, 65536), &[]));
    t.extend(structure(17, 0x1103, &dimm(0x8000 | 512, 0), &[]));
    t.extend(structure(127, 0xfeff, &[], &[]));
    t
}

#[test]
fn parses_all_types() {
    let s = parse(&sample_table(), Some((3, 0)));
    assert!(!s.truncated);
    assert_eq!(s.bios_version.as_deref(), Some("1.16.2"));
    assert_eq!(s.manufacturer.as_deref(), Some("Acme"));
    assert_eq!(s.product.as_deref(), Some("Rack 9"));
    assert_eq!(s.serial.as_deref(), Some("SN-42"));
    assert_eq!(s.sku.as_deref(), Some("SKU-7"));
    assert_eq!(
        s.uuid.as_deref(),
        Some("12345678-1234-5678-9abc-def012345678")
    );
    assert_eq!(s.processors.len(), 2, "the unpopulated socket is skipped");
    assert_eq!(
        s.processors[0],
        Processor {
            socket: "CPU 0".into(),
            manufacturer: Some("GenuineIntel".into()),
            version: Some("Xeon X".into()),
            max_speed_mhz: Some(2600),
            cores: 8,
            threads: 16,
        }
    );
    assert_eq!((s.processors[1].cores, s.processors[1].threads), (300, 600));
    assert_eq!(s.memory_devices, vec![1 << 30, 64 << 30, 512 << 10]);
    assert_eq!(s.memory_bytes(), (1 << 30) + (64u64 << 30) + (512 << 10));
}

#[test]
fn uuid_byte_order_follows_version() {
    let s = parse(&sample_table(), Some((2, 5)));
    assert_eq!(
        s.uuid.as_deref(),
        Some("78563412-3412-7856-9abc-def012345678")
    );
    let s = parse(&sample_table(), Some((2, 8)));
    assert_eq!(
        s.uuid.as_deref(),
        Some("12345678-1234-5678-9abc-def012345678")
    );
    assert_eq!(uuid(&[0; 16], true), None);
    assert_eq!(uuid(&[0xff; 16], true), None);
}

#[test]
fn entry_points() {
    let mut ep3 = vec![0u8; 0x18];
    ep3[..5].copy_from_slice(b"_SM3_");
    ep3[7] = 3;
    ep3[8] = 2;
    assert_eq!(entry_point_version(&ep3), Some((3, 2)));
    let mut ep2 = vec![0u8; 0x1f];
    ep2[..4].copy_from_slice(b"_SM_");
    ep2[6] = 2;
    ep2[7] = 8;
    assert_eq!(entry_point_version(&ep2), Some((2, 8)));
    assert_eq!(entry_point_version(b"_SM_"), None);
    assert_eq!(
        entry_point_version(b"garbage garbage garbage garbage"),
        None
    );
}

#[test]
fn truncated_tables_keep_what_came_before() {
    let t = sample_table();
    for cut in 0..t.len() {
        let s = parse(&t[..cut], Some((3, 0)));
        if cut > 40 {
            assert_eq!(s.bios_version.as_deref(), Some("1.16.2"), "cut at {cut}");
        }
    }
    // Cut inside the system structure's strings: flagged, BIOS kept, no system.
    let s = parse(&t[..50], None);
    assert!(s.truncated);
    assert_eq!(s.manufacturer, None);
}

#[test]
fn oversized_and_unterminated_tables_are_bounded() {
    // An unterminated string set running past MAX_TABLE: the walk stops at the cap.
    let mut t = structure(0, 0, &area(0x18, &[(0x05, &[1])]), &["1.0"]);
    t.extend(vec![4u8, 0x30, 0, 0]);
    t.resize(MAX_TABLE + 4096, b'A');
    let s = parse(&t, None);
    assert!(s.truncated);
    assert_eq!(s.bios_version.as_deref(), Some("1.0"));
    assert!(s.processors.is_empty());
    // Endless tiny structures: at most MAX_STRUCTURES are walked.
    let one = structure(17, 0, &area(0x28, &[(0x0c, &1u16.to_le_bytes())]), &[]);
    let t: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(one.len() * (MAX_STRUCTURES + 10))
        .collect();
    let s = parse(&t, None);
    assert!(s.truncated);
    assert_eq!(s.memory_devices.len(), MAX_STRUCTURES);
    // A huge string is cut.
    let long = "x".repeat(10_000);
    let t = structure(0, 0, &area(0x18, &[(0x05, &[1])]), &[&long]);
    assert_eq!(parse(&t, None).bios_version.unwrap().len(), MAX_STRING);
}

#[test]
fn garbage_never_panics() {
    let mut x: u32 = 0x1234_5678;
    for len in 0..600 {
        let mut v = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            v.push((x >> 8) as u8);
        }
        let _ = parse(&v, None);
        let _ = entry_point_version(&v);
    }
    // Short structures with string indexes pointing nowhere.
    let t = structure(1, 0, &[9, 9, 9, 9], &[]);
    let s = parse(&t, None);
    assert_eq!(s.manufacturer, None);
    assert_eq!(s.uuid, None);
}
