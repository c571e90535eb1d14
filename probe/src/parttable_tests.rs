//! Unit tests of the partition-table reader and range planner on tables built here
//! byte by byte (GPT with CRCs, its backup, plain MBR, corrupt and hostile headers).

use super::*;

const MIB: u64 = 1 << 20;

/// A GPT disk image of `size` bytes (512-byte sectors) with `parts` as (first, last) LBAs
/// and `count` entries of `esize` bytes; primary and backup.
fn gpt_disk(size: u64, parts: &[(u64, u64)], count: u32, esize: u32) -> Vec<u8> {
    let mut d = vec![0u8; size as usize];
    // Protective MBR.
    d[446 + 4] = 0xEE;
    d[446 + 8..446 + 12].copy_from_slice(&1u32.to_le_bytes());
    d[446 + 12..446 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    d[510] = 0x55;
    d[511] = 0xAA;
    let lbas = size / 512;
    let mut arr = vec![0u8; (count * esize) as usize];
    for (i, &(s, l)) in parts.iter().enumerate() {
        let e = &mut arr[i * esize as usize..(i + 1) * esize as usize];
        e[..16].copy_from_slice(&[0xAF; 16]);
        e[16..32].copy_from_slice(&[i as u8 + 1; 16]);
        e[32..40].copy_from_slice(&s.to_le_bytes());
        e[40..48].copy_from_slice(&l.to_le_bytes());
    }
    let arr_sectors = (arr.len() as u64).div_ceil(512);
    let backup_entries = lbas - 1 - arr_sectors;
    for (my, alt, entries) in [(1, lbas - 1, 2), (lbas - 1, 1, backup_entries)] {
        let mut h = vec![0u8; 92];
        h[..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my.to_le_bytes());
        h[32..40].copy_from_slice(&alt.to_le_bytes());
        h[40..48].copy_from_slice(&(2 + arr_sectors).to_le_bytes());
        h[48..56].copy_from_slice(&(backup_entries - 1).to_le_bytes());
        h[72..80].copy_from_slice(&entries.to_le_bytes());
        h[80..84].copy_from_slice(&count.to_le_bytes());
        h[84..88].copy_from_slice(&esize.to_le_bytes());
        h[88..92].copy_from_slice(&crc32(&arr).to_le_bytes());
        let c = crc32(&h);
        h[16..20].copy_from_slice(&c.to_le_bytes());
        let at = (my * 512) as usize;
        d[at..at + 92].copy_from_slice(&h);
        let e = (entries * 512) as usize;
        d[e..e + arr.len()].copy_from_slice(&arr);
    }
    d
}

fn parse_all(d: &[u8]) -> Table {
    let w = (WINDOW as usize).min(d.len());
    parse(&d[..w], &d[d.len() - w..], d.len() as u64)
}

#[test]
fn crc32_matches_the_reference() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn good_gpt() {
    let d = gpt_disk(8 * MIB, &[(2048, 4095), (4096, 12287)], 128, 128);
    let t = parse_all(&d);
    assert_eq!(
        t.scheme,
        Scheme::Gpt {
            backup: false,
            lba: 512
        },
        "{:?}",
        t.notes
    );
    assert_eq!(
        t.parts,
        vec![
            Part {
                start: MIB,
                len: MIB
            },
            Part {
                start: 2 * MIB,
                len: 4 * MIB
            }
        ]
    );
    assert!(t.notes.is_empty(), "{:?}", t.notes);
}

#[test]
fn corrupt_primary_uses_the_backup() {
    let mut d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    d[512 + 40] ^= 1; // header crc no longer matches
    let t = parse_all(&d);
    assert_eq!(
        t.scheme,
        Scheme::Gpt {
            backup: true,
            lba: 512
        }
    );
    assert_eq!(t.parts.len(), 1);
    assert!(
        t.notes.iter().any(|n| n.contains("header crc")),
        "{:?}",
        t.notes
    );
    // Entries corrupt in the primary only.
    let mut d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    d[1024 + 40] ^= 1;
    let t = parse_all(&d);
    assert_eq!(
        t.parts,
        vec![Part {
            start: MIB,
            len: MIB
        }]
    );
    assert!(matches!(t.scheme, Scheme::Gpt { backup: true, .. }));
    // The primary wiped entirely (first MiB zero): still the backup.
    let mut d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    d[..MIB as usize].fill(0);
    assert!(matches!(
        parse_all(&d).scheme,
        Scheme::Gpt { backup: true, .. }
    ));
}

#[test]
fn both_corrupt_is_no_table() {
    let mut d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    d[512 + 40] ^= 1;
    let n = d.len();
    d[n - 512 + 40] ^= 1;
    let t = parse_all(&d);
    assert_eq!(t.scheme, Scheme::None);
    assert!(t.parts.is_empty());
    assert!(
        t.notes.iter().any(|n| n.contains("protective")),
        "{:?}",
        t.notes
    );
}

#[test]
fn hostile_headers_are_refused() {
    // More than 128 entries: refused on both headers.
    let d = gpt_disk(8 * MIB, &[(2048, 4095)], 256, 128);
    let t = parse_all(&d);
    assert_eq!(t.scheme, Scheme::None);
    assert!(
        t.notes.iter().any(|n| n.contains("256 entries")),
        "{:?}",
        t.notes
    );
    // Entry sizes that are not 128..=4096 multiples of 8.
    for esize in [64u32, 132, 8192] {
        let d = gpt_disk(8 * MIB, &[(2048, 4095)], 4, esize);
        assert_eq!(parse_all(&d).scheme, Scheme::None, "entry size {esize}");
    }
    // Large legal entries are fine.
    let d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 4096);
    assert!(matches!(parse_all(&d).scheme, Scheme::Gpt { .. }));
    // A partition past the end of the device is left out.
    let d = gpt_disk(8 * MIB, &[(2048, 4095), (4096, 1 << 40)], 128, 128);
    assert_eq!(parse_all(&d).parts.len(), 1);
}

#[test]
fn plain_mbr() {
    let mut d = vec![0u8; 64 * MIB as usize];
    d[510] = 0x55;
    d[511] = 0xAA;
    let entries = [
        (0x83u8, 2048u32, 4096u32),
        (0x05, 8192, 8192),
        (0x0c, 1 << 30, 10),
    ];
    for (i, (kind, s, n)) in entries.into_iter().enumerate() {
        let e = 446 + i * 16;
        d[e + 4] = kind;
        d[e + 8..e + 12].copy_from_slice(&s.to_le_bytes());
        d[e + 12..e + 16].copy_from_slice(&n.to_le_bytes());
    }
    let t = parse_all(&d);
    assert_eq!(t.scheme, Scheme::Mbr);
    assert_eq!(
        t.parts,
        vec![
            Part {
                start: MIB,
                len: 2 * MIB
            },
            Part {
                start: 4 * MIB,
                len: 4 * MIB
            }
        ]
    );
    assert!(t.notes.iter().any(|n| n.contains("extended")));
    assert!(t.notes.iter().any(|n| n.contains("outside")));
}

#[test]
fn garbage_and_tiny_inputs() {
    assert_eq!(parse(&[], &[], 0).scheme, Scheme::None);
    assert_eq!(parse(&[0xFF; 700], &[0xFF; 700], 700).scheme, Scheme::None);
    let mut x = 0x1234_5678_9abc_def0u64;
    let junk: Vec<u8> = (0..(2 * MIB))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let t = parse_all(&junk);
    assert!(t.parts.len() <= 4);
    // Head and tail shorter than the device they claim to be from.
    let d = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    let t = parse(&d[..4096], &d[d.len() - 4096..], 1 << 40);
    assert!(t.parts.iter().all(|p| p.start + p.len <= 1 << 40));
}

#[test]
fn four_k_sectors() {
    // The same layout read as 4096-byte sectors: built with 512 and scaled by hand is
    // more work than it is worth; a header at LBA 1 of 4096 bytes is enough.
    let d512 = gpt_disk(8 * MIB, &[(2048, 4095)], 128, 128);
    let mut d = vec![0u8; 64 * MIB as usize];
    // Move the primary header to offset 4096 and its entries to 8192 (LBA 2).
    d[4096..4096 + 92].copy_from_slice(&d512[512..512 + 92]);
    d[8192..8192 + 16384].copy_from_slice(&d512[1024..1024 + 16384]);
    let h = &mut d[4096..4096 + 92];
    h[48..56].copy_from_slice(&16000u64.to_le_bytes());
    h[16..20].fill(0);
    let c = crc32(h);
    h[16..20].copy_from_slice(&c.to_le_bytes());
    let t = parse_all(&d);
    assert_eq!(
        t.scheme,
        Scheme::Gpt {
            backup: false,
            lba: 4096
        }
    );
    assert_eq!(
        t.parts,
        vec![Part {
            start: 2048 * 4096,
            len: 2048 * 4096
        }]
    );
}

#[test]
fn plan_covers_ends_and_mirrors() {
    let size = 300u64 << 30;
    let parts = [
        Part {
            start: MIB,
            len: 100 * MIB,
        },
        Part {
            start: 101 * MIB,
            len: size - 102 * MIB,
        },
    ];
    let r = plan(size, &parts);
    let covered = |at: u64| r.iter().any(|x| x.start <= at && at < x.end);
    for at in [
        0,
        MIB - 1,
        MIB + 1024,
        101 * MIB - 1,
        101 * MIB + 1024,
        size - 1,
        size - MIB,
        MIB + (64 << 20),
        101 * MIB + (64 << 20),
        101 * MIB + (256 << 30),
        64 << 20,
        256 << 30,
    ] {
        assert!(covered(at), "{at} not covered by {r:?}");
    }
    assert!(!covered(50 * MIB));
    // Sorted, disjoint, aligned, inside the device.
    for w in r.windows(2) {
        assert!(w[0].end < w[1].start);
    }
    assert!(r
        .iter()
        .all(|x| x.start % ALIGN == 0 && x.end <= size && !x.is_empty()));
}

#[test]
fn plan_small_and_odd_devices() {
    assert!(plan(0, &[]).is_empty());
    assert_eq!(
        plan(5000, &[]),
        vec![Range {
            start: 0,
            end: 5000
        }]
    );
    assert_eq!(
        plan(3 * MIB, &[]),
        vec![
            Range { start: 0, end: MIB },
            Range {
                start: 2 * MIB,
                end: 3 * MIB
            }
        ]
    );
    // A partition with an unaligned start and one past the end.
    let r = plan(
        8 * MIB,
        &[
            Part {
                start: 4 * MIB + 512,
                len: 4096,
            },
            Part {
                start: 7 * MIB,
                len: u64::MAX,
            },
        ],
    );
    assert!(r
        .iter()
        .any(|x| x.start == 4 * MIB && x.end >= 4 * MIB + 4608));
    assert!(r.iter().all(|x| x.end <= 8 * MIB));
}
