//! Fuzz the install's root device hints (`bootplane_probe::hints`): the input is the
//! hints document as it arrives (`--root-device-hints`, or `bootplane.root_hints=` on the
//! kernel command line after %-decoding). Any panic is a bug; beyond that: a document
//! over 4 KiB is refused, an accepted one has at least one hint and every string hint is
//! 1 to 255 characters without control characters, parsing is deterministic, and
//! matching the hints against a few disks picks at most one (`choose` is `Ok` exactly
//! when one disk's `check` is).
//!
//! `scripts/fuzz.sh` runs it; seeds in `fuzz/seeds/root_hints/` (Ironic's and Metal3's
//! examples, every size operator).
#![no_main]

use bootplane_probe::hints::{check, choose, DiskFacts, Hints, MAX_HINTS};
use bootplane_probe::install::percent_decode;
use libfuzzer_sys::fuzz_target;

fn disks() -> Vec<DiskFacts> {
    let d = |path: &str, gib: u64, serial: Option<&str>, rot: Option<bool>| DiskFacts {
        path: path.into(),
        size_bytes: gib << 30,
        serial: serial.map(str::to_string),
        wwn: Some("naa.5000c500a1b2c3d4".into()),
        vendor: Some("ATA     ".into()),
        model: Some("QEMU HARDDISK".into()),
        rotational: rot,
        by_path: vec![format!("/dev/disk/by-path/{gib}")],
    };
    vec![
        d("/dev/sda", 10, Some("S1"), Some(true)),
        d("/dev/sdb", 100, None, Some(false)),
        d("/dev/vda", 1, Some("x"), None),
    ]
}

fuzz_target!(|data: &[u8]| {
    for doc in [
        Some(data.to_vec()),
        std::str::from_utf8(data)
            .ok()
            .and_then(|s| percent_decode(s).ok())
            .map(String::into_bytes),
    ]
    .into_iter()
    .flatten()
    {
        let got = Hints::parse(&doc);
        assert_eq!(got, Hints::parse(&doc), "parsing is not deterministic");
        let Ok(h) = got else { continue };
        assert!(doc.len() <= MAX_HINTS);
        assert_ne!(h, Hints::default(), "accepted without a hint");
        for s in [&h.name, &h.wwn, &h.serial, &h.vendor, &h.model, &h.by_path]
            .into_iter()
            .flatten()
        {
            assert!(
                !s.is_empty() && s.len() <= 255 && !s.chars().any(char::is_control),
                "{s:?}"
            );
        }
        let disks = disks();
        let matching = disks.iter().filter(|d| check(d, &h).is_ok()).count();
        match choose(&disks, &h) {
            Ok((i, why)) => {
                assert_eq!(matching, 1);
                assert!(check(&disks[i], &h).is_ok() && !why.is_empty());
            }
            Err(e) => {
                assert_ne!(matching, 1);
                assert!(!e.is_empty());
            }
        }
    }
});
