//! Property test of the packed image format: random small images (random bytes, text
//! and all-zero runs, sizes around frame boundaries) → `image::pack::pack` →
//! `image::stream::provision` into a new file gives back the same bytes, the manifest
//! parses back to what the packer returned, and the seek table lists every frame.
//! Few cases (each packs and streams a few MiB).

use bootplane::image::format::{parse_seek_table, Manifest};
use bootplane::image::pack::{manifest_path, pack, PackOptions};
use bootplane::image::stream::{provision, FrameSha, Options};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// Runs of (kind, length): 0 random, 1 text, 2 zeros.
fn image() -> impl Strategy<Value = Vec<u8>> {
    let run = (0u8..3, 1usize..(MIB + MIB / 2), any::<u64>());
    proptest::collection::vec(run, 0..4).prop_map(|runs| {
        let mut v = Vec::new();
        for (kind, len, seed) in runs {
            let mut x = seed | 1;
            match kind {
                0 => v.extend((0..len).map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })),
                1 => v.extend(b"bootplane images ".iter().cycle().take(len)),
                _ => v.resize(v.len() + len, 0),
            }
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn pack_then_provision_gives_the_image_back(data in image(), frame_mib in 1u64..=2, zero_skip in any::<bool>()) {
        let d = tempfile::tempdir().unwrap();
        let raw = d.path().join("raw");
        std::fs::write(&raw, &data).unwrap();
        let img = d.path().join("img.zst");
        let opts = PackOptions { frame_size: frame_mib << 20, level: 1, threads: 2 };
        let m = pack(&raw, &img, &manifest_path(&img), &opts).unwrap();
        prop_assert_eq!(m.raw_size, data.len() as u64);
        let mbytes = std::fs::read(manifest_path(&img)).unwrap();
        prop_assert_eq!(&Manifest::parse(&mbytes).unwrap(), &m);
        let packed = std::fs::read(&img).unwrap();
        prop_assert_eq!(packed.len() as u64, m.compressed_size);
        let table = parse_seek_table(&packed).unwrap();
        prop_assert_eq!(table.len(), m.frames.len());
        for (t, f) in table.iter().zip(&m.frames) {
            prop_assert_eq!((u64::from(t.0), u64::from(t.1)), (f.compressed_size, f.raw_size));
        }
        for &(s, l) in &m.zero_ranges {
            prop_assert!(data[s as usize..(s + l) as usize].iter().all(|&b| b == 0));
        }

        let out = d.path().join("out");
        let mut o = Options::new(img.to_str().unwrap(), &out);
        o.frame_sha256 = FrameSha::On;
        o.zero_skip = zero_skip;
        o.checkpoint = Some(d.path().join("ckpt"));
        let done = provision(&o).unwrap();
        prop_assert_eq!(&done.sha256, &m.sha256);
        prop_assert!(std::fs::read(&out).unwrap() == data, "provisioned bytes differ");
    }
}
