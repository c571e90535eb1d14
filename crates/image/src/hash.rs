//! SHA-256 whose intermediate state can be saved and restored.
//!
//! The whole-image digest is serial; to resume an interrupted copy without re-reading
//! what is already on the target, the checkpoint stores the digest's chaining state
//! after the last durable frame. `sha2::Sha256` does not expose that state, so this
//! wraps the crate's (SHA-NI accelerated) `compress256` and does the padding itself.

use sha2::digest::generic_array::{typenum::U64, GenericArray};

const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// Streaming SHA-256 with a serialisable midstate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResumableSha256 {
    h: [u32; 8],
    len: u64,
    pending: Vec<u8>,
}

impl Default for ResumableSha256 {
    fn default() -> Self {
        Self::new()
    }
}

fn compress(h: &mut [u32; 8], data: &[u8]) {
    debug_assert_eq!(data.len() % 64, 0);
    // SAFETY: GenericArray<u8, U64> is a [u8; 64] with alignment 1, so any byte slice
    // whose length is a multiple of 64 is a valid slice of blocks.
    let blocks: &[GenericArray<u8, U64>] = unsafe {
        std::slice::from_raw_parts(
            data.as_ptr() as *const GenericArray<u8, U64>,
            data.len() / 64,
        )
    };
    sha2::compress256(h, blocks);
}

impl ResumableSha256 {
    pub(crate) fn new() -> Self {
        ResumableSha256 {
            h: H0,
            len: 0,
            pending: Vec::with_capacity(64),
        }
    }

    /// Bytes hashed so far.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.pending.is_empty() {
            let take = (64 - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() < 64 {
                return;
            }
            let block = std::mem::take(&mut self.pending);
            compress(&mut self.h, &block);
            self.pending = block;
            self.pending.clear();
        }
        let whole = data.len() / 64 * 64;
        if whole > 0 {
            compress(&mut self.h, &data[..whole]);
        }
        self.pending.extend_from_slice(&data[whole..]);
    }

    pub(crate) fn finalize(mut self) -> [u8; 32] {
        let bits = self.len.wrapping_mul(8);
        let mut tail = std::mem::take(&mut self.pending);
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&bits.to_be_bytes());
        compress(&mut self.h, &tail);
        let mut out = [0u8; 32];
        for (i, w) in self.h.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// The state as a string `len:h0h1..h7:pendinghex`, for checkpoints.
    pub(crate) fn save(&self) -> String {
        let words: String = self.h.iter().map(|w| format!("{w:08x}")).collect();
        format!("{}:{}:{}", self.len, words, hex::encode(&self.pending))
    }

    /// Parse a string made by [`save`](Self::save).
    pub(crate) fn restore(s: &str) -> Option<Self> {
        let mut it = s.split(':');
        let len: u64 = it.next()?.parse().ok()?;
        let words = it.next()?;
        let pending = hex::decode(it.next()?).ok()?;
        if it.next().is_some()
            || words.len() != 64
            || pending.len() >= 64
            || len % 64 != pending.len() as u64 % 64
        {
            return None;
        }
        let mut h = [0u32; 8];
        for (i, w) in h.iter_mut().enumerate() {
            *w = u32::from_str_radix(words.get(i * 8..i * 8 + 8)?, 16).ok()?;
        }
        Some(ResumableSha256 { h, len, pending })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn matches_sha2_for_odd_splits_and_survives_save_restore() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for split in [0usize, 1, 55, 56, 63, 64, 65, 127, 4096, 9999, 10_000] {
            let mut h = ResumableSha256::new();
            h.update(&data[..split]);
            let h = ResumableSha256::restore(&h.save()).unwrap();
            let mut h2 = h.clone();
            h2.update(&data[split..]);
            assert_eq!(
                h2.finalize().as_slice(),
                Sha256::digest(&data).as_slice(),
                "split {split}"
            );
        }
        assert_eq!(
            ResumableSha256::new().finalize().as_slice(),
            Sha256::digest(b"").as_slice()
        );
    }

    #[test]
    fn restore_rejects_garbage() {
        assert!(ResumableSha256::restore("").is_none());
        assert!(ResumableSha256::restore("1:00:").is_none());
        assert!(ResumableSha256::restore("x:y:z").is_none());
    }
}
