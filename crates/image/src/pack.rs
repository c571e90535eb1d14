//! `bootplane image pack`: raw image → independent zstd frames + seek table + manifest.
//!
//! One reader thread cuts the input into `frame_size` chunks, one worker per core
//! compresses each chunk (with zstd's frame checksum) and hashes it, and the calling
//! thread writes frames in order while computing the whole-image SHA-256.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::format::{self, Frame, Manifest};
use super::stream::read_full;

#[derive(Debug, Clone)]
pub struct PackOptions {
    pub frame_size: u64,
    pub level: i32,
    pub threads: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            frame_size: format::DEFAULT_FRAME_SIZE,
            level: 3,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
        }
    }
}

/// Default manifest path for a packed image.
pub fn manifest_path(image: &Path) -> std::path::PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(".manifest.json");
    s.into()
}

struct Done {
    idx: usize,
    raw: Vec<u8>,
    comp: Vec<u8>,
    sha: [u8; 32],
    zeros: Vec<(u64, u64)>,
}

fn zero_runs(data: &[u8], base: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for (i, c) in data.chunks(format::ZERO_GRAIN).enumerate() {
        if c.len() == format::ZERO_GRAIN && is_all_zero(c) {
            format::push_zero_range(
                &mut v,
                base + (i * format::ZERO_GRAIN) as u64,
                c.len() as u64,
            );
        }
    }
    v
}

/// Whether every byte of `c` is zero. Safe code: OR-folding fixed 64-byte blocks is
/// vectorised by the compiler (several times faster than the `align_to::<u64>` loop it
/// replaces, which needed `unsafe`), and a non-zero block still ends the scan early.
pub(crate) fn is_all_zero(c: &[u8]) -> bool {
    let mut blocks = c.chunks_exact(64);
    blocks
        .by_ref()
        .all(|b| b.iter().fold(0u8, |acc, &x| acc | x) == 0)
        && blocks.remainder().iter().all(|&b| b == 0)
}

/// Pack `input` into `output` and write the manifest to `manifest_out`.
pub fn pack(
    input: &Path,
    output: &Path,
    manifest_out: &Path,
    opts: &PackOptions,
) -> Result<Manifest> {
    if opts.frame_size == 0
        || !opts.frame_size.is_multiple_of(format::FRAME_ALIGN)
        || opts.frame_size > format::MAX_FRAME_SIZE
    {
        bail!("frame size must be a multiple of 1 MiB and at most 64 MiB");
    }
    let mut inp = File::open(input).with_context(|| format!("opening {}", input.display()))?;
    let mut out = std::io::BufWriter::with_capacity(
        8 << 20,
        File::create(output).with_context(|| format!("creating {}", output.display()))?,
    );
    let fs = opts.frame_size as usize;
    let threads = opts.threads.max(1);
    let (job_tx, job_rx) = sync_channel::<(usize, Vec<u8>)>(threads);
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (done_tx, done_rx) = sync_channel::<Result<Done>>(threads * 2);

    let reader = std::thread::spawn(move || -> Result<()> {
        let mut idx = 0;
        loop {
            let mut buf = vec![0u8; fs];
            let n = read_full(&mut inp, &mut buf).context("reading input image")?;
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            if job_tx.send((idx, buf)).is_err() {
                return Ok(());
            }
            idx += 1;
            if n < fs {
                return Ok(());
            }
        }
    });
    let mut workers = Vec::new();
    for _ in 0..threads {
        let rx = job_rx.clone();
        let tx = done_tx.clone();
        let level = opts.level;
        workers.push(std::thread::spawn(move || {
            let mut c = match zstd::bulk::Compressor::new(level).and_then(|mut c| {
                c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                    .map(|_| c)
            }) {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(anyhow::anyhow!("creating zstd compressor: {e}")));
                    return;
                }
            };
            loop {
                let job = rx.lock().map(|r| r.recv());
                let Ok(Ok((idx, raw))) = job else { return };
                let r = c
                    .compress(&raw)
                    .context("compressing frame")
                    .map(|comp| Done {
                        idx,
                        sha: Sha256::digest(&raw).into(),
                        zeros: zero_runs(&raw, idx as u64 * fs as u64),
                        raw,
                        comp,
                    });
                if tx.send(r).is_err() {
                    return;
                }
            }
        }));
    }
    drop(done_tx);

    let mut pending = BTreeMap::new();
    let mut next = 0usize;
    let mut whole = Sha256::new();
    let mut frames = Vec::new();
    let mut zero_ranges = Vec::new();
    let mut off = 0u64;
    let mut raw_size = 0u64;
    for d in done_rx {
        let d = d?;
        pending.insert(d.idx, d);
        while let Some(d) = pending.remove(&next) {
            whole.update(&d.raw);
            out.write_all(&d.comp).context("writing packed image")?;
            frames.push(Frame {
                offset: off,
                compressed_size: d.comp.len() as u64,
                raw_offset: raw_size,
                raw_size: d.raw.len() as u64,
                sha256: hex::encode(d.sha),
            });
            for (s, l) in d.zeros {
                format::push_zero_range(&mut zero_ranges, s, l);
            }
            off += d.comp.len() as u64;
            raw_size += d.raw.len() as u64;
            next += 1;
        }
    }
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("worker thread panicked"))?;
    }
    if !pending.is_empty() {
        bail!("internal error: frames left unwritten");
    }
    let table: Vec<(u32, u32)> = frames
        .iter()
        .map(|f| (f.compressed_size as u32, f.raw_size as u32))
        .collect();
    let st = format::seek_table(&table);
    out.write_all(&st).context("writing seek table")?;
    let f = out
        .into_inner()
        .map_err(|e| anyhow::anyhow!("flushing packed image: {}", e.error()))?;
    f.sync_all().context("syncing packed image")?;
    let m = Manifest {
        format: format::FORMAT.into(),
        raw_size,
        sha256: hex::encode(whole.finalize()),
        compressed_size: off + st.len() as u64,
        frame_size: opts.frame_size,
        frames,
        zero_ranges,
    };
    m.validate()
        .map_err(|e| anyhow::anyhow!("internal error: packed manifest invalid: {e}"))?;
    let tmp = manifest_out.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&m)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, manifest_out)
        .with_context(|| format!("renaming to {}", manifest_out.display()))?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_all_zero_sees_one_set_bit_anywhere() {
        // Lengths around the 64-byte block, at every start offset (alignment).
        let buf = vec![0u8; 300];
        for start in 0..16 {
            for len in [0, 1, 63, 64, 65, 127, 128, 129, 200] {
                let s = &buf[start..start + len];
                assert!(is_all_zero(s), "start {start} len {len}");
                for i in 0..len {
                    let mut v = s.to_vec();
                    v[i] = 0x80;
                    assert!(!is_all_zero(&v), "start {start} len {len} at {i}");
                }
            }
        }
    }

    #[test]
    fn packs_frames_that_decode_back_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        let inp = dir.path().join("raw");
        let mut data = vec![0u8; (2 << 20) + 12345];
        for (i, b) in data.iter_mut().enumerate().skip(300_000) {
            *b = (i * 31 / 7) as u8;
        }
        std::fs::write(&inp, &data).unwrap();
        let out = dir.path().join("img.zst");
        let mp = manifest_path(&out);
        let opts = PackOptions {
            frame_size: 1 << 20,
            level: 1,
            threads: 2,
        };
        let m = pack(&inp, &out, &mp, &opts).unwrap();
        assert_eq!(m.frames.len(), 3);
        assert_eq!(m.raw_size, data.len() as u64);
        assert_eq!(m.sha256, hex::encode(Sha256::digest(&data)));
        assert_eq!(m.zero_ranges, vec![(0, 4 * 65536)]);
        let packed = std::fs::read(&out).unwrap();
        assert_eq!(packed.len() as u64, m.compressed_size);
        assert_eq!(zstd::stream::decode_all(&packed[..]).unwrap(), data);
        let st = format::parse_seek_table(&packed).unwrap();
        assert_eq!(st.len(), 3);
        assert_eq!(Manifest::parse(&std::fs::read(&mp).unwrap()).unwrap(), m);
    }
}
