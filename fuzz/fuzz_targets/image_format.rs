//! Fuzz the packed image format end to end: a manifest and a packed file from the
//! input → `image::stream::provision` (manifest parsing and validation, frame reads,
//! zstd frame decoding and checksums, per-frame and whole-image SHA-256, the seek
//! table and trailing-data checks, the held-back first MiB) into a fresh target file.
//! Check: provisioning succeeds only with an image whose SHA-256 is the manifest's,
//! written in full, and a failure never leaves the first MiB non-zero. Also the seek
//! table and manifest parsers on their own.
//!
//! Input: u16 LE manifest length, the manifest JSON, then the packed file. Manifests
//! over 8 MiB of raw data are skipped (a harness bound: the target is a real file).
#![no_main]

use std::path::PathBuf;

use bootplane::image::format::{parse_seek_table, Manifest};
use bootplane::image::stream::{provision, FrameSha, Options};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const RAW_MAX: u64 = 8 << 20;

thread_local! {
    static DIR: PathBuf = {
        let d = std::env::temp_dir().join(format!("bootplane-fuzz-image-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    };
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_seek_table(data);
    if data.len() < 2 {
        return;
    }
    let mlen = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let Some(manifest) = data.get(2..2 + mlen) else { return };
    let packed = &data[2 + mlen..];
    let Ok(m) = Manifest::parse(manifest) else { return };
    assert!(m.validate().is_ok());
    if m.raw_size > RAW_MAX {
        return;
    }
    DIR.with(|d| {
        let img = d.join("image.zst");
        let target = d.join("target.raw");
        let ckpt = d.join("ckpt.json");
        std::fs::write(&img, packed).unwrap();
        std::fs::write(d.join("image.zst.manifest.json"), manifest).unwrap();
        let _ = std::fs::remove_file(&target);
        let _ = std::fs::remove_file(&ckpt);
        let mut o = Options::new(img.to_str().unwrap(), &target);
        o.frame_sha256 = FrameSha::On;
        o.resume = false;
        o.checkpoint = Some(ckpt);
        o.decoders = Some(1);
        o.writers = 1;
        o.quiet = true;
        let res = provision(&o);
        let written = std::fs::read(&target).unwrap_or_default();
        match res {
            Ok(out) => {
                assert_eq!(written.len() as u64, m.raw_size);
                let sha = hex::encode(Sha256::digest(&written));
                assert_eq!(sha, m.sha256.trim().to_ascii_lowercase());
                assert_eq!(out.sha256, sha);
            }
            Err(_) => {
                let head = &written[..written.len().min(1 << 20)];
                assert!(head.iter().all(|&b| b == 0), "failed run left data in the first MiB");
            }
        }
    });
});
