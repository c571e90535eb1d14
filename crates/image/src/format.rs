//! The packed image format: independent zstd frames plus a JSON manifest.
//!
//! A packed image is a valid multi-frame `.zst` file (the `zstd` CLI decompresses it)
//! whose frames each hold `frame_size` bytes of raw data (the last frame may hold less)
//! and carry zstd's own XXH64 content checksum. It ends with a seek table in the zstd
//! seekable format (a skippable frame, magic `0x184D2A5E`, footer magic `0x8F92EAB1`),
//! so seekable-format readers can random-access it. Next to it lives the manifest
//! (`<image>.manifest.json`):
//!
//! ```json
//! {"format":"bootplane-image/1","raw_size":N,"sha256":"<whole raw image>",
//!  "compressed_size":N,"frame_size":4194304,
//!  "frames":[{"offset":0,"compressed_size":C,"raw_offset":0,"raw_size":R,"sha256":"<frame raw data>"}],
//!  "zero_ranges":[[start,len]]}
//! ```
//!
//! `zero_ranges` lists all-zero raw ranges (64 KiB granularity, sorted, merged).

use serde::{Deserialize, Serialize};

pub(crate) const FORMAT: &str = "bootplane-image/1";
pub(crate) const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
pub(crate) const SEEKABLE_SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
pub(crate) const SEEKABLE_FOOTER_MAGIC: u32 = 0x8F92_EAB1;
/// Default raw bytes per frame.
pub(crate) const DEFAULT_FRAME_SIZE: u64 = 4 << 20;
/// Frames must be a multiple of this (so the held-back first MiB and O_DIRECT
/// alignment fall on frame-internal boundaries).
pub(crate) const FRAME_ALIGN: u64 = 1 << 20;
/// Largest frame accepted from a manifest (bounds memory use).
pub(crate) const MAX_FRAME_SIZE: u64 = 64 << 20;
/// Granularity of the zero-range map.
pub(crate) const ZERO_GRAIN: usize = 64 << 10;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Frame {
    pub offset: u64,
    pub compressed_size: u64,
    pub raw_offset: u64,
    pub raw_size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: String,
    pub raw_size: u64,
    pub sha256: String,
    pub compressed_size: u64,
    pub frame_size: u64,
    pub frames: Vec<Frame>,
    #[serde(default)]
    pub zero_ranges: Vec<(u64, u64)>,
}

/// Why a manifest was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ManifestError(pub String);

pub(crate) fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let v = hex::decode(s.trim()).ok()?;
    v.try_into().ok()
}

impl Manifest {
    /// Parse and check that the frame table is consistent (contiguous, bounded, in order).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| ManifestError(format!("manifest is not valid json: {e}")))?;
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<(), ManifestError> {
        let bad = |s: String| Err(ManifestError(s));
        if self.format != FORMAT {
            return bad(format!("unknown manifest format {:?}", self.format));
        }
        if parse_sha256(&self.sha256).is_none() {
            return bad("manifest sha256 is not 64 hex digits".into());
        }
        if self.frame_size == 0
            || !self.frame_size.is_multiple_of(FRAME_ALIGN)
            || self.frame_size > MAX_FRAME_SIZE
        {
            return bad(format!(
                "frame_size {} must be a multiple of 1 MiB and at most 64 MiB",
                self.frame_size
            ));
        }
        let want_frames = self.raw_size.div_ceil(self.frame_size);
        if self.frames.len() as u64 != want_frames {
            return bad(format!(
                "{} frames listed, {} expected for raw_size {}",
                self.frames.len(),
                want_frames,
                self.raw_size
            ));
        }
        let mut off = 0u64;
        for (i, f) in self.frames.iter().enumerate() {
            let raw_off = i as u64 * self.frame_size;
            let raw_len = self.frame_size.min(self.raw_size - raw_off);
            if f.raw_offset != raw_off || f.raw_size != raw_len {
                return bad(format!(
                    "frame {i}: raw range {}+{} should be {raw_off}+{raw_len}",
                    f.raw_offset, f.raw_size
                ));
            }
            if f.offset != off || f.compressed_size == 0 || f.compressed_size > 2 * MAX_FRAME_SIZE {
                return bad(format!(
                    "frame {i}: compressed range {}+{} does not follow offset {off}",
                    f.offset, f.compressed_size
                ));
            }
            if parse_sha256(&f.sha256).is_none() {
                return bad(format!("frame {i}: sha256 is not 64 hex digits"));
            }
            off += f.compressed_size;
        }
        if self.compressed_size < off {
            return bad(format!(
                "compressed_size {} is smaller than the frames ({off})",
                self.compressed_size
            ));
        }
        let mut prev_end = 0u64;
        for &(s, l) in &self.zero_ranges {
            if s < prev_end || l == 0 || s.checked_add(l).is_none_or(|e| e > self.raw_size) {
                return bad(format!(
                    "zero range {s}+{l} is out of order or out of bounds"
                ));
            }
            prev_end = s + l;
        }
        Ok(())
    }

    /// End of the last frame in the packed file (start of the seek table).
    pub(crate) fn frames_end(&self) -> u64 {
        self.frames
            .last()
            .map(|f| f.offset + f.compressed_size)
            .unwrap_or(0)
    }

    /// True when `[start, start+len)` lies inside one zero range.
    pub(crate) fn is_zero(&self, start: u64, len: u64) -> bool {
        let i = self.zero_ranges.partition_point(|&(s, _)| s <= start);
        i > 0 && {
            let (s, l) = self.zero_ranges[i - 1];
            start >= s && start + len <= s + l
        }
    }
}

/// The seekable-format seek table for frames of (compressed, raw) sizes, no checksums.
pub(crate) fn seek_table(frames: &[(u32, u32)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + frames.len() * 8 + 9);
    v.extend_from_slice(&SEEKABLE_SKIPPABLE_MAGIC.to_le_bytes());
    v.extend_from_slice(&((frames.len() * 8 + 9) as u32).to_le_bytes());
    for &(c, d) in frames {
        v.extend_from_slice(&c.to_le_bytes());
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    v.push(0); // descriptor: no checksums
    v.extend_from_slice(&SEEKABLE_FOOTER_MAGIC.to_le_bytes());
    v
}

/// Parse a seek table at the end of `tail` (the last bytes of a file). Returns the
/// (compressed, raw) size of each frame. Used to check packed files in tests and tools.
pub fn parse_seek_table(tail: &[u8]) -> Option<Vec<(u32, u32)>> {
    let n = tail.len();
    if n < 17 || u32::from_le_bytes(tail[n - 4..].try_into().ok()?) != SEEKABLE_FOOTER_MAGIC {
        return None;
    }
    let frames = u32::from_le_bytes(tail[n - 9..n - 5].try_into().ok()?) as usize;
    let desc = tail[n - 5];
    let entry = if desc & 0x80 != 0 { 12 } else { 8 };
    let size = 8 + frames.checked_mul(entry)? + 9;
    if size > n {
        return None;
    }
    let t = &tail[n - size..];
    if u32::from_le_bytes(t[0..4].try_into().ok()?) != SEEKABLE_SKIPPABLE_MAGIC {
        return None;
    }
    Some(
        (0..frames)
            .map(|i| {
                let e = &t[8 + i * entry..];
                (
                    u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect(),
    )
}

/// True for a zstd frame or a zstd skippable frame magic.
pub(crate) fn is_zstd_magic(b: &[u8]) -> bool {
    b.len() >= 4 && (b[..4] == ZSTD_MAGIC || (b[1..4] == [0x2a, 0x4d, 0x18] && b[0] & 0xf0 == 0x50))
}

/// Merge sorted zero ranges that touch.
pub(crate) fn push_zero_range(v: &mut Vec<(u64, u64)>, start: u64, len: u64) {
    if let Some(last) = v.last_mut() {
        if last.0 + last.1 == start {
            last.1 += len;
            return;
        }
    }
    v.push((start, len));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let fs = 1 << 20;
        Manifest {
            format: FORMAT.into(),
            raw_size: fs * 2 + 5,
            sha256: "00".repeat(32),
            compressed_size: 300,
            frame_size: fs,
            frames: (0..3)
                .map(|i| Frame {
                    offset: i * 100,
                    compressed_size: 100,
                    raw_offset: i * fs,
                    raw_size: if i == 2 { 5 } else { fs },
                    sha256: "11".repeat(32),
                })
                .collect(),
            zero_ranges: vec![(0, 1 << 16), (1 << 20, 1 << 17)],
        }
    }

    #[test]
    fn valid_manifest_round_trips() {
        let m = manifest();
        let j = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse(&j).unwrap(), m);
        assert!(m.is_zero(1 << 20, 1 << 16));
        assert!(!m.is_zero(0, 1 << 17));
        assert!(!m.is_zero(5 << 20, 1));
    }

    #[test]
    fn inconsistent_manifests_are_rejected() {
        let mut m = manifest();
        m.frames[1].offset = 99;
        assert!(m.validate().is_err());
        let mut m = manifest();
        m.frames.pop();
        assert!(m.validate().is_err());
        let mut m = manifest();
        m.frame_size = 1000;
        assert!(m.validate().is_err());
        let mut m = manifest();
        m.zero_ranges = vec![(m.raw_size, 1)];
        assert!(m.validate().is_err());
        let mut m = manifest();
        m.sha256 = "zz".into();
        assert!(m.validate().is_err());
        assert!(Manifest::parse(b"{").is_err());
    }

    #[test]
    fn seek_table_round_trips() {
        let f = vec![(10, 20), (30, 40)];
        let mut file = vec![1u8, 2, 3];
        file.extend(seek_table(&f));
        assert_eq!(parse_seek_table(&file).unwrap(), f);
        assert!(parse_seek_table(&file[..file.len() - 1]).is_none());
    }

    #[test]
    fn magic_detection() {
        assert!(is_zstd_magic(&[0x28, 0xb5, 0x2f, 0xfd, 0]));
        assert!(is_zstd_magic(&0x184D2A5Eu32.to_le_bytes()));
        assert!(!is_zstd_magic(b"\x7fELF"));
        assert!(!is_zstd_magic(b"ab"));
    }
}
