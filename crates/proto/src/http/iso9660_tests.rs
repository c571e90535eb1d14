//! The ISO writer read back by Debian's readers: `isoinfo` (genisoimage) for the
//! listing, the volume and the El Torito catalog, `osirrox` (xorriso) to extract the
//! files; the boot information table checked against the bytes as mkisofs defines it.

use super::*;
use std::process::Command;

fn run(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog} (apt-get install genisoimage xorriso): {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deterministic bytes, not a multiple of 4 or of a sector.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn read_back_by_isoinfo_and_osirrox() {
    let boot = bytes(5001, 1);
    let big = bytes(70_001, 2);
    let cfg = b"DEFAULT x\n".to_vec();
    let esp = bytes(3 * 512 + 7, 3);
    let files = [
        IsoFile {
            name: "isolinux.bin",
            data: &boot,
        },
        IsoFile {
            name: "ipxe.krn",
            data: &big,
        },
        IsoFile {
            name: "isolinux.cfg",
            data: &cfg,
        },
        IsoFile {
            name: "EMPTY",
            data: &[],
        },
        IsoFile {
            name: "efi.img",
            data: &esp,
        },
    ];
    let el = ElTorito {
        boot_file: "isolinux.bin",
        load_sectors: 4,
        boot_info_table: true,
        efi_image: Some("efi.img"),
    };
    // 2026-11-25 02:40:00 UTC
    let img = build("bootplane test", &files, Some(el), 1_795_574_400).unwrap();
    assert_eq!(img.len() % SECTOR, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.iso");
    std::fs::write(&path, &img).unwrap();
    let p = path.to_str().unwrap();

    let listing = run("isoinfo", &["-l", "-i", p]);
    for n in ["ISOLINUX.BIN;1", "IPXE.KRN;1", "ISOLINUX.CFG;1", "EMPTY;1"] {
        assert!(listing.contains(n), "{n} missing: {listing}");
    }
    assert!(listing.contains("Nov 25 2026"), "{listing}");
    let d = run("isoinfo", &["-d", "-i", p]);
    assert!(d.contains("Volume id: BOOTPLANETEST"), "{d}");
    assert!(
        d.contains(&format!("Volume size is: {}", img.len() / SECTOR)),
        "{d}"
    );
    assert!(d.contains("El Torito VD version 1 found"), "{d}");
    assert!(d.contains("Key 55 AA"), "{d}");
    assert!(d.contains("Boot media 0 (No Emulation Boot)"), "{d}");
    assert!(d.contains("Nsect 4"), "{d}");
    assert!(d.contains("Bootid 88 (bootable)"), "{d}");
    // xorriso's report of the catalog: the BIOS entry and the UEFI one.
    let r = run("xorriso", &["-indev", p, "-report_el_torito", "plain"]);
    assert!(
        r.contains("El Torito boot img :   1  BIOS  y   none"),
        "{r}"
    );
    assert!(
        r.contains("El Torito boot img :   2  UEFI  y   none"),
        "{r}"
    );
    assert!(r.contains("/ISOLINUX.BIN") && r.contains("/EFI.IMG"), "{r}");

    // The boot file's LBA from the catalog, and its table.
    let esp_lba = {
        let c = u32::from_le_bytes(img[17 * SECTOR + 71..17 * SECTOR + 75].try_into().unwrap());
        let e = &img[c as usize * SECTOR + 96..];
        assert_eq!(&img[c as usize * SECTOR + 64..][..4], &[0x91, 0xEF, 1, 0]);
        assert_eq!(
            u16::from_le_bytes([e[6], e[7]]),
            4,
            "512-byte sectors of efi.img"
        );
        u32::from_le_bytes(e[8..12].try_into().unwrap())
    };
    assert_eq!(&img[esp_lba as usize * SECTOR..][..esp.len()], &esp[..]);
    let cat = u32::from_le_bytes(img[17 * SECTOR + 71..17 * SECTOR + 75].try_into().unwrap());
    let c = &img[cat as usize * SECTOR..];
    let lba = u32::from_le_bytes(c[40..44].try_into().unwrap());
    assert!(d.contains(&format!("Bootoff {lba:X} {lba}")), "{d}");
    let f = &img[lba as usize * SECTOR..lba as usize * SECTOR + boot.len()];
    let word = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    let mut padded = boot[64..].to_vec();
    padded.resize(padded.len().next_multiple_of(4), 0);
    let sum = padded.chunks(4).fold(0u32, |a, w| {
        a.wrapping_add(u32::from_le_bytes(w.try_into().unwrap()))
    });
    assert_eq!(
        (word(8), word(12), word(16), word(20)),
        (16, lba, boot.len() as u32, sum)
    );
    assert!(f[24..64].iter().all(|b| *b == 0));
    assert_eq!((&f[..8], &f[64..]), (&boot[..8], &boot[64..]));

    // Every file extracted intact by another implementation (xorriso's).
    let out = dir.path().join("x");
    run(
        "osirrox",
        &["-indev", p, "-extract", "/", out.to_str().unwrap()],
    );
    let mut expect_boot = boot.clone();
    expect_boot[8..64].copy_from_slice(&f[8..64]);
    for (n, data) in [
        ("ISOLINUX.BIN", &expect_boot),
        ("IPXE.KRN", &big),
        ("ISOLINUX.CFG", &cfg),
        ("EMPTY", &Vec::new()),
        ("EFI.IMG", &esp),
    ] {
        // osirrox maps names without Rock Ridge to lowercase and drops ";1".
        let got = std::fs::read(out.join(n.to_lowercase()))
            .or_else(|_| std::fs::read(out.join(n)))
            .unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(got == *data, "{n} differs");
    }
}

#[test]
fn many_files_spill_the_root_directory_over_sectors() {
    let names: Vec<String> = (0..100)
        .map(|i| format!("FILE_WITH_A_LONG_NAME{i:03}.DAT"))
        .collect();
    let files: Vec<IsoFile<'_>> = names
        .iter()
        .map(|n| IsoFile {
            name: n,
            data: n.as_bytes(),
        })
        .collect();
    let img = build("X", &files, None, 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.iso");
    std::fs::write(&path, &img).unwrap();
    let listing = run("isoinfo", &["-l", "-i", path.to_str().unwrap()]);
    assert_eq!(listing.matches(".DAT;1").count(), 100, "{listing}");
    let out = dir.path().join("x");
    run(
        "osirrox",
        &[
            "-indev",
            path.to_str().unwrap(),
            "-extract",
            "/",
            out.to_str().unwrap(),
        ],
    );
    let n = &names[77];
    let got = std::fs::read(out.join(n.to_lowercase()))
        .or_else(|_| std::fs::read(out.join(n)))
        .unwrap();
    assert_eq!(got, n.as_bytes());
}

#[test]
fn bad_input_is_an_error() {
    let f = |name| IsoFile { name, data: b"x" };
    assert_eq!(
        build("X", &[f("a/b")], None, 0).unwrap_err(),
        IsoError::BadName("a/b".into())
    );
    assert!(matches!(
        build("X", &[f("a.b.c")], None, 0),
        Err(IsoError::BadName(_))
    ));
    assert!(matches!(
        build("X", &[f("a"), f("A")], None, 0),
        Err(IsoError::Duplicate(_))
    ));
    let el = ElTorito {
        boot_file: "b",
        load_sectors: 4,
        boot_info_table: true,
        efi_image: None,
    };
    assert!(matches!(
        build("X", &[f("a")], Some(el), 0),
        Err(IsoError::NoBootFile(_))
    ));
    assert!(matches!(
        build("X", &[f("b")], Some(el), 0),
        Err(IsoError::BootFileTooShort(_))
    ));
    let el = ElTorito {
        boot_info_table: false,
        efi_image: Some("nope"),
        ..el
    };
    assert!(matches!(
        build("X", &[f("b")], Some(el), 0),
        Err(IsoError::NoBootFile(_))
    ));
}
