//! A small-input DEFLATE (RFC 1951) compressor for the gzip attempts of Butane data URLs.
//!
//! Why hand-written: a Butane translation gzips every file's contents once to see
//! whether gzip + base64 makes a shorter data URL (as butane does). Those contents are
//! usually a few hundred bytes to a few KiB, and every general-purpose deflate we
//! measured (miniz_oxide, zlib-rs, libdeflate) clears 128–225 KiB of fixed-size hash
//! tables per stream, even when reusing one compressor: for a 20-file config that reset
//! was about a third of a cold render. Here the hash table is sized to the input (at
//! most 2^15 entries), so the cost of a call scales with the input.
//!
//! What it does: greedy LZ77 over the whole input taking the nearest earlier occurrence
//! of the next 3 bytes (a 3-byte hash table, as miniz level 1 does; on config text this
//! compressed as well as a 32-candidate longest-match search with lazy matching, at a
//! fraction of the cost), into ONE final block that is the
//! smallest of stored, fixed-Huffman and dynamic-Huffman (code lengths limited to 15 /
//! 7 bits by halving frequencies until the tree fits; every tree has at least two codes,
//! so it is complete, which zlib's and Go's decoders require). Inputs larger than
//! [`MAX_INPUT`] are not handled here (the caller uses miniz_oxide, whose table reset
//! is then small next to the input).
//!
//! Tested by round trip through flate2's decoder (random, repetitive and edge-case
//! inputs) and against miniz_oxide level 1 output sizes, in this file.

/// Largest input compressed here (one stored block holds at most 65,535 bytes).
pub(crate) const MAX_INPUT: usize = 65_535;

const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;
const WINDOW: usize = 32_768;

const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// Order in which code-length code lengths are sent.
const CLEN_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Index (0..29) of the length code for a match length 3..=258.
fn len_code(len: usize) -> usize {
    let l = len - MIN_MATCH;
    if len == MAX_MATCH {
        28
    } else if l < 8 {
        l
    } else {
        let b = (usize::BITS - 1 - l.leading_zeros()) as usize;
        4 * (b - 1) + ((l >> (b - 2)) & 3)
    }
}

/// Distance code (0..30) for a distance 1..=32768.
fn dist_code(d: usize) -> usize {
    if d <= 4 {
        d - 1
    } else {
        let x = d - 1;
        let l = (usize::BITS - 1 - x.leading_zeros()) as usize;
        2 * l + ((x >> (l - 1)) & 1)
    }
}

/// An LZ77 token: a literal byte, or a match (length, distance).
#[derive(Clone, Copy)]
enum Tok {
    Lit(u8),
    Match(u16, u16),
}

/// Raw DEFLATE of `data` (at most [`MAX_INPUT`] bytes; None for larger inputs).
pub(crate) fn deflate(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() > MAX_INPUT {
        return None;
    }
    Some(encode(data, &lz77(data)))
}

/// One final block for the tokens of `data`: stored, fixed or dynamic, the shortest.
fn encode(data: &[u8], toks: &[Tok]) -> Vec<u8> {
    let mut lit_freq = [0u32; 286];
    let mut dist_freq = [0u32; 30];
    for t in toks {
        match *t {
            Tok::Lit(b) => lit_freq[b as usize] += 1,
            Tok::Match(l, d) => {
                lit_freq[257 + len_code(l as usize)] += 1;
                dist_freq[dist_code(d as usize)] += 1;
            }
        }
    }
    lit_freq[256] = 1;

    // Dynamic Huffman tables and their cost in bits.
    let lit_len = limited_lengths(&at_least_two(&lit_freq), 15);
    let dist_len = limited_lengths(&at_least_two(&dist_freq), 15);
    let hlit = (257..=286)
        .rev()
        .find(|&n| lit_len[n - 1] != 0)
        .unwrap_or(257);
    let hdist = (1..=30).rev().find(|&n| dist_len[n - 1] != 0).unwrap_or(1);
    let mut all = lit_len[..hlit].to_vec();
    all.extend_from_slice(&dist_len[..hdist]);
    let rle = rle_lengths(&all);
    let mut clen_freq = [0u32; 19];
    for &(sym, _) in &rle {
        clen_freq[sym as usize] += 1;
    }
    let clen_len = limited_lengths(&at_least_two(&clen_freq), 7);
    let hclen = (4..=19)
        .rev()
        .find(|&n| clen_len[CLEN_ORDER[n - 1]] != 0)
        .unwrap_or(4);
    let extra_bits: u64 = (0..29)
        .map(|c| lit_freq[257 + c] as u64 * LEN_EXTRA[c] as u64)
        .sum::<u64>()
        + (0..30)
            .map(|c| dist_freq[c] as u64 * DIST_EXTRA[c] as u64)
            .sum::<u64>();
    let payload = |ll: &[u8], dl: &[u8]| -> u64 {
        (0..286)
            .map(|s| lit_freq[s] as u64 * ll[s] as u64)
            .sum::<u64>()
            + (0..30)
                .map(|s| dist_freq[s] as u64 * dl[s] as u64)
                .sum::<u64>()
            + extra_bits
    };
    let rle_bits: u64 = rle
        .iter()
        .map(|&(s, _)| {
            clen_len[s as usize] as u64
                + [2, 3, 7][(s as usize).saturating_sub(16).min(2)] * (s >= 16) as u64
        })
        .sum();
    let dynamic_bits = 3 + 14 + 3 * hclen as u64 + rle_bits + payload(&lit_len, &dist_len);
    let (fixed_lit, fixed_dist) = fixed_lengths();
    let fixed_bits = 3 + payload(&fixed_lit, &fixed_dist);
    let stored_bits = 8 * (1 + 4 + data.len() as u64);

    let mut w = Bits::with_capacity(data.len() / 2 + 64);
    if stored_bits <= fixed_bits.min(dynamic_bits) {
        w.put(1, 3); // BFINAL, BTYPE 00
        w.align();
        let n = data.len() as u16;
        w.out.extend_from_slice(&n.to_le_bytes());
        w.out.extend_from_slice(&(!n).to_le_bytes());
        w.out.extend_from_slice(data);
        return w.out;
    }
    if fixed_bits <= dynamic_bits {
        w.put(1 | (1 << 1), 3); // BFINAL, BTYPE 01
        write_tokens(
            &mut w,
            toks,
            &codes(&fixed_lit),
            &fixed_lit,
            &codes(&fixed_dist),
            &fixed_dist,
        );
    } else {
        w.put(1 | (2 << 1), 3); // BFINAL, BTYPE 10
        w.put((hlit - 257) as u32, 5);
        w.put((hdist - 1) as u32, 5);
        w.put((hclen - 4) as u32, 4);
        for &s in &CLEN_ORDER[..hclen] {
            w.put(clen_len[s] as u32, 3);
        }
        let clen_code = codes(&clen_len);
        for &(s, extra) in &rle {
            w.put(clen_code[s as usize] as u32, clen_len[s as usize] as u32);
            match s {
                16 => w.put(extra as u32, 2),
                17 => w.put(extra as u32, 3),
                18 => w.put(extra as u32, 7),
                _ => {}
            }
        }
        write_tokens(
            &mut w,
            toks,
            &codes(&lit_len),
            &lit_len,
            &codes(&dist_len),
            &dist_len,
        );
    }
    w.align();
    w.out
}

/// Greedy LZ77: at each position, the nearest earlier occurrence of the next 3 bytes
/// (hash table sized to the input), extended as far as it matches.
fn lz77(data: &[u8]) -> Vec<Tok> {
    let n = data.len();
    let mut toks = Vec::with_capacity(n / 2 + 8);
    if n < MIN_MATCH + 1 {
        toks.extend(data.iter().map(|&b| Tok::Lit(b)));
        return toks;
    }
    let bits = (usize::BITS - (n - 1).leading_zeros()).clamp(8, 15);
    let mut head = vec![0u32; 1 << bits];
    let hash = |i: usize| -> usize {
        let v = (data[i] as u32) << 16 | (data[i + 1] as u32) << 8 | data[i + 2] as u32;
        (v.wrapping_mul(2_654_435_761) >> (32 - bits)) as usize
    };
    let mut i = 0;
    while i < n {
        if i + MIN_MATCH > n {
            toks.push(Tok::Lit(data[i]));
            i += 1;
            continue;
        }
        let h = hash(i);
        let cand = head[h] as usize;
        head[h] = i as u32 + 1;
        let mut len = 0;
        if cand != 0 && i - (cand - 1) <= WINDOW {
            let c = cand - 1;
            let max = (n - i).min(MAX_MATCH);
            while len < max && data[c + len] == data[i + len] {
                len += 1;
            }
        }
        if len < MIN_MATCH {
            toks.push(Tok::Lit(data[i]));
            i += 1;
            continue;
        }
        toks.push(Tok::Match(len as u16, (i - (cand - 1)) as u16));
        // Positions inside the match go into the table too, for later matches.
        for j in i + 1..(i + len).min(n - MIN_MATCH + 1) {
            head[hash(j)] = j as u32 + 1;
        }
        i += len;
    }
    toks
}

fn write_tokens(w: &mut Bits, toks: &[Tok], lc: &[u16], ll: &[u8], dc: &[u16], dl: &[u8]) {
    for t in toks {
        match *t {
            Tok::Lit(b) => w.put(lc[b as usize] as u32, ll[b as usize] as u32),
            Tok::Match(l, d) => {
                let (l, d) = (l as usize, d as usize);
                let c = len_code(l);
                w.put(lc[257 + c] as u32, ll[257 + c] as u32);
                w.put((l - LEN_BASE[c] as usize) as u32, LEN_EXTRA[c] as u32);
                let c = dist_code(d);
                w.put(dc[c] as u32, dl[c] as u32);
                w.put((d - DIST_BASE[c] as usize) as u32, DIST_EXTRA[c] as u32);
            }
        }
    }
    w.put(lc[256] as u32, ll[256] as u32);
}

/// The fixed Huffman code lengths (RFC 1951 3.2.6).
fn fixed_lengths() -> (Vec<u8>, Vec<u8>) {
    let mut lit = vec![8u8; 288];
    lit[144..256].fill(9);
    lit[256..280].fill(7);
    (lit, vec![5u8; 30])
}

/// `freq` with at least two symbols used, so that its Huffman code is complete.
fn at_least_two(freq: &[u32]) -> Vec<u32> {
    let mut f = freq.to_vec();
    for i in 0..f.len() {
        if f.iter().filter(|&&x| x > 0).count() >= 2 {
            break;
        }
        if f[i] == 0 {
            f[i] = 1;
        }
    }
    f
}

/// Huffman code lengths for `freq`, none longer than `limit`: frequencies are halved
/// (staying >= 1) until the tree fits, which ends at the latest when all are equal.
fn limited_lengths(freq: &[u32], limit: u8) -> Vec<u8> {
    let mut f = freq.to_vec();
    loop {
        let lens = huffman_lengths(&f);
        if lens.iter().all(|&l| l <= limit) {
            return lens;
        }
        for x in f.iter_mut().filter(|x| **x > 0) {
            *x = (*x >> 1).max(1);
        }
    }
}

/// Plain Huffman code lengths (0 for unused symbols; at least two used symbols).
fn huffman_lengths(freq: &[u32]) -> Vec<u8> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = freq.len();
    let mut parent = vec![usize::MAX; 2 * n];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = freq
        .iter()
        .enumerate()
        .filter(|(_, &f)| f > 0)
        .map(|(i, &f)| Reverse((f as u64, i)))
        .collect();
    let mut next = n;
    while heap.len() > 1 {
        let Some(Reverse((fa, a))) = heap.pop() else {
            break;
        };
        let Some(Reverse((fb, b))) = heap.pop() else {
            break;
        };
        parent[a] = next;
        parent[b] = next;
        heap.push(Reverse((fa + fb, next)));
        next += 1;
    }
    (0..n)
        .map(|s| {
            if freq[s] == 0 {
                return 0;
            }
            let (mut d, mut x) = (0u8, s);
            while parent[x] != usize::MAX {
                x = parent[x];
                d = d.saturating_add(1);
            }
            d
        })
        .collect()
}

/// Canonical codes for `lens` (RFC 1951 3.2.2), bit-reversed for LSB-first output.
fn codes(lens: &[u8]) -> Vec<u16> {
    let mut count = [0u16; 16];
    for &l in lens {
        count[l as usize] += 1;
    }
    count[0] = 0;
    let mut next = [0u16; 16];
    let mut code = 0u16;
    for b in 1..16 {
        code = (code + count[b - 1]) << 1;
        next[b] = code;
    }
    lens.iter()
        .map(|&l| {
            if l == 0 {
                return 0;
            }
            let c = next[l as usize];
            next[l as usize] += 1;
            c.reverse_bits() >> (16 - l)
        })
        .collect()
}

/// Run-length coding of code lengths with the symbols 16 (repeat previous 3–6), 17
/// (3–10 zeros) and 18 (11–138 zeros): (symbol, extra-bits value).
fn rle_lengths(lens: &[u8]) -> Vec<(u8, u8)> {
    let mut out = Vec::new();
    let mut i = 0;
    // The length a 16 would repeat (none at the start).
    let mut prev: Option<u8> = None;
    while i < lens.len() {
        let v = lens[i];
        let run = lens[i..].iter().take_while(|&&x| x == v).count();
        if v == 0 && run >= 3 {
            let r = run.min(138);
            if r >= 11 {
                out.push((18, (r - 11) as u8));
            } else {
                out.push((17, (r - 3) as u8));
            }
            i += r;
        } else if prev == Some(v) && run >= 3 {
            let r = run.min(6);
            out.push((16, (r - 3) as u8));
            i += r;
        } else {
            out.push((v, 0));
            i += 1;
        }
        prev = Some(v);
    }
    out
}

/// LSB-first bit writer.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn with_capacity(c: usize) -> Bits {
        Bits {
            out: Vec::with_capacity(c),
            acc: 0,
            n: 0,
        }
    }

    fn put(&mut self, v: u32, bits: u32) {
        self.acc |= (v as u64) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    fn align(&mut self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
            self.acc = 0;
            self.n = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn inflate(z: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::DeflateDecoder::new(z)
            .read_to_end(&mut out)
            .expect("valid deflate stream");
        out
    }

    fn miniz_fast(data: &[u8]) -> usize {
        use std::io::Write;
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap().len()
    }

    /// xorshift: deterministic pseudo-random bytes without a dependency.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn codes_tables() {
        for (c, &b) in LEN_BASE.iter().enumerate() {
            assert_eq!(len_code(b as usize), c);
            if c < 28 {
                let last = b as usize + (1 << LEN_EXTRA[c]) - 1;
                assert_eq!(len_code(last.min(257)), c, "len {last}");
            }
        }
        for (c, &b) in DIST_BASE.iter().enumerate() {
            assert_eq!(dist_code(b as usize), c);
            assert_eq!(dist_code(b as usize + (1 << DIST_EXTRA[c]) - 1), c);
        }
    }

    #[test]
    fn round_trips_edge_cases() {
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            b"ab".to_vec(),
            b"abc".to_vec(),
            b"abcd".to_vec(),
            vec![b'a'; 1000],
            vec![0; MAX_INPUT],
            (0..=255u8).collect(),
            (0..MAX_INPUT).map(|i| (i % 251) as u8).collect(),
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        cases.push((0..MAX_INPUT).map(|_| rng(&mut seed) as u8).collect());
        for c in &cases {
            let z = deflate(c).expect("fits");
            assert_eq!(&inflate(&z), c, "len {}", c.len());
            // stored is always a candidate
            assert!(z.len() <= c.len() + 5 + 1);
        }
        assert!(deflate(&vec![0; MAX_INPUT + 1]).is_none());
    }

    /// Random and repetitive inputs of random sizes, over small alphabets (long matches,
    /// skewed trees, length limiting) and large ones.
    #[test]
    fn round_trips_random_inputs() {
        let mut seed = 0x1234_5678_9abc_def1;
        for round in 0..400 {
            let n = (rng(&mut seed) % [64, 600, 5000, 40_000][round % 4]) as usize;
            let alphabet = [2u64, 4, 16, 64, 256][(round / 4) % 5];
            let mut d = Vec::with_capacity(n);
            while d.len() < n {
                if d.len() > 8 && rng(&mut seed).is_multiple_of(3) {
                    // copy an earlier piece: repetitive text
                    let from = (rng(&mut seed) as usize) % d.len();
                    let len = 1 + (rng(&mut seed) as usize) % 300;
                    for k in 0..len {
                        if d.len() >= n {
                            break;
                        }
                        let b = d[from + k % (d.len() - from)];
                        d.push(b);
                    }
                } else {
                    d.push(b'a'.wrapping_add((rng(&mut seed) % alphabet) as u8));
                }
            }
            let z = deflate(&d).expect("fits");
            assert_eq!(inflate(&z), d, "round {round}, len {n}");
        }
        // Skewed frequencies (Fibonacci-like counts) force the 15-bit limit.
        let mut d = Vec::new();
        let (mut a, mut b) = (1usize, 1usize);
        for s in 0..25u8 {
            d.extend(std::iter::repeat_n(s.wrapping_mul(37), a));
            (a, b) = (b, a + b);
            if d.len() > 60_000 {
                break;
            }
        }
        let mut seed = 7;
        for i in (1..d.len()).rev() {
            d.swap(i, (rng(&mut seed) as usize) % (i + 1));
        }
        d.truncate(MAX_INPUT);
        assert_eq!(inflate(&deflate(&d).unwrap()), d);
    }

    /// Config-like text (what data URLs carry) compresses about as well as miniz level 1,
    /// which the gzip attempts used before: in total smaller, each at most 1% + 2 bytes
    /// larger (measured: -22 to +2 bytes).
    #[test]
    fn about_as_small_as_miniz_fast_on_config_text() {
        let (mut ours_total, mut miniz_total) = (0, 0);
        for lines in [1usize, 2, 3, 4, 6, 8, 10, 13, 16, 25, 49, 120] {
            let mut t = String::new();
            for j in 0..lines {
                t.push_str(&format!("key{j} = value-{j}-for-server-00042\n"));
            }
            let ours = deflate(t.as_bytes()).unwrap();
            assert_eq!(inflate(&ours), t.as_bytes());
            let m = miniz_fast(t.as_bytes());
            assert!(
                ours.len() <= m + m / 100 + 2,
                "{lines} lines: {} vs {m}",
                ours.len()
            );
            ours_total += ours.len();
            miniz_total += m;
        }
        assert!(ours_total < miniz_total, "{ours_total} vs {miniz_total}");
        let unit = "[Unit]\nDescription=app\nAfter=network-online.target\n[Service]\nExecStart=/usr/bin/app --config /etc/app/app.conf\nRestart=always\n[Install]\nWantedBy=multi-user.target\n";
        let m = miniz_fast(unit.as_bytes());
        assert!(deflate(unit.as_bytes()).unwrap().len() <= m + m / 100 + 2);
    }
}
