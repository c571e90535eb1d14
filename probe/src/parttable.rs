//! The partition-table reader and range planner of `bootplane probe wipe`: pure functions
//! from untrusted bytes to byte ranges, no I/O (the caller reads the device's first and
//! last [`WINDOW`] bytes and passes them in), so they are unit-tested on crafted tables
//! and fuzzed (`fuzz/fuzz_targets/wipe_parttable.rs`).
//!
//! [`parse`] reads a GPT (protective MBR + primary header and entries, checked by their
//! CRC32s; the backup header in the last LBA when the primary is missing or corrupt), or
//! a plain MBR's four primary entries (extended partitions are named in the notes and
//! their logical partitions are not followed: the extended entry's own first MiB is
//! still zeroed). Logical block sizes of 512 and 4096 bytes are tried. Bounds: at most
//! [`MAX_ENTRIES`] GPT entries of 128..=4096 bytes (a multiple of 8), every LBA inside the
//! device and the entry array inside the window read, else that header is refused.
//!
//! [`plan`] turns a device size and its partitions into the ranges the `metadata` policy
//! zeroes: the first and last MiB of the device and of every partition, and btrfs's
//! superblock mirrors (64 MiB and 256 GiB into the device and each partition), aligned
//! outward to 4 KiB, clipped to the device, sorted and merged.

/// Bytes read at each end of the device for [`parse`] (and zeroed by [`plan`]).
pub const WINDOW: u64 = 1 << 20;
/// Most GPT partition entries accepted (the usual array size; more is refused).
pub const MAX_ENTRIES: u32 = 128;
/// Largest GPT entry size accepted.
pub const MAX_ENTRY_SIZE: u32 = 4096;
/// Offsets of btrfs's superblock mirrors from the start of a file system (the primary
/// copy at 64 KiB is inside the first MiB).
pub const BTRFS_MIRRORS: [u64; 2] = [64 << 20, 256 << 30];
/// Alignment of every planned range (O_DIRECT on 512- and 4096-byte sectors).
pub const ALIGN: u64 = 4096;
/// Bytes zeroed at a btrfs mirror (one superblock).
const BTRFS_SUPER: u64 = 4096;

/// A partition found in the table, in bytes from the start of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub len: u64,
}

/// The kind of table found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// No table (or one that was refused: see the notes).
    None,
    /// A plain MBR (up to four primary entries).
    Mbr,
    /// A GPT, read from its primary (`backup: false`) or its backup header.
    Gpt { backup: bool, lba: u64 },
}

/// What [`parse`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub scheme: Scheme,
    pub parts: Vec<Part>,
    /// Why a header or entry was refused, extended partitions not followed, ...
    pub notes: Vec<String>,
}

/// The device's bytes that were read: its first `head.len()` and last `tail.len()` bytes.
struct Bytes<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    size: u64,
}

impl Bytes<'_> {
    /// `len` bytes at `off`, when they lie inside what was read.
    fn at(&self, off: u64, len: u64) -> Option<&[u8]> {
        let end = off.checked_add(len)?;
        if end > self.size {
            return None;
        }
        if end <= self.head.len() as u64 {
            return self.head.get(off as usize..end as usize);
        }
        let tail_start = self.size - self.tail.len() as u64;
        if off >= tail_start {
            return self
                .tail
                .get((off - tail_start) as usize..(end - tail_start) as usize);
        }
        None
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// CRC-32 (IEEE 802.3, reflected, as GPT uses).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Read the partition table of a device of `size` bytes whose first bytes are `head`
/// and last bytes are `tail` (each at most the device; [`WINDOW`] bytes is enough for
/// any table this accepts).
pub fn parse(head: &[u8], tail: &[u8], size: u64) -> Table {
    let mut notes = Vec::new();
    let head = &head[..head.len().min(usize::try_from(size).unwrap_or(usize::MAX))];
    let tail = &tail[tail.len() - tail.len().min(usize::try_from(size).unwrap_or(usize::MAX))..];
    let b = Bytes { head, tail, size };
    let mbr = b.at(0, 512).filter(|m| m[510] == 0x55 && m[511] == 0xAA);
    let protective = mbr.is_some_and(|m| (0..4).any(|i| m[446 + i * 16 + 4] == 0xEE));
    // A GPT is looked for even without a protective MBR (a wiped or hybrid first
    // sector): a valid header with good CRCs is a table.
    for lba in [512u64, 4096] {
        match gpt(&b, lba, 1, false) {
            Ok(parts) => return table(Scheme::Gpt { backup: false, lba }, parts, notes),
            Err(e) if e.is_empty() => {}
            Err(e) => notes.push(format!("primary gpt ({lba}-byte sectors): {e}")),
        }
        let last = size / lba;
        if last >= 2 {
            match gpt(&b, lba, last - 1, true) {
                Ok(parts) => {
                    notes.push("using the backup gpt".into());
                    return table(Scheme::Gpt { backup: true, lba }, parts, notes);
                }
                Err(e) if e.is_empty() => {}
                Err(e) => notes.push(format!("backup gpt ({lba}-byte sectors): {e}")),
            }
        }
    }
    match mbr {
        Some(m) if !protective => {
            let parts = mbr_parts(m, size, &mut notes);
            table(Scheme::Mbr, parts, notes)
        }
        Some(_) => {
            notes.push("protective mbr without a valid gpt".into());
            table(Scheme::None, Vec::new(), notes)
        }
        None => table(Scheme::None, Vec::new(), notes),
    }
}

fn table(scheme: Scheme, parts: Vec<Part>, notes: Vec<String>) -> Table {
    Table {
        scheme,
        parts,
        notes,
    }
}

/// The partitions of the GPT whose header is at LBA `at` (`lba`-byte sectors). An empty
/// error: no header there at all; another: a header that was refused, and why.
fn gpt(b: &Bytes, lba: u64, at: u64, backup: bool) -> Result<Vec<Part>, String> {
    let h = b.at(at * lba, lba).ok_or_else(String::new)?;
    if &h[..8] != b"EFI PART" {
        return Err(String::new());
    }
    let hsize = u32_at(h, 12) as u64;
    if !(92..=lba).contains(&hsize) {
        return Err(format!("header size {hsize}"));
    }
    let mut hdr = h[..hsize as usize].to_vec();
    let want = u32_at(&hdr, 16);
    hdr[16..20].fill(0);
    if crc32(&hdr) != want {
        return Err("header crc mismatch".into());
    }
    let lbas = b.size / lba;
    let (my, first, last) = (u64_at(h, 24), u64_at(h, 40), u64_at(h, 48));
    if my != at {
        return Err(format!("header says it is at lba {my}, found at {at}"));
    }
    if first > last || last >= lbas {
        return Err(format!("usable lbas {first}..={last} outside the device"));
    }
    let (entries_lba, count, esize) = (u64_at(h, 72), u32_at(h, 80), u32_at(h, 84));
    if count > MAX_ENTRIES {
        return Err(format!("{count} entries (at most {MAX_ENTRIES})"));
    }
    if !(128..=MAX_ENTRY_SIZE).contains(&esize) || esize % 8 != 0 {
        return Err(format!("entry size {esize}"));
    }
    let len = count as u64 * esize as u64;
    if entries_lba >= lbas || (backup && entries_lba >= at) || (!backup && entries_lba <= at) {
        return Err(format!("entry array at lba {entries_lba}"));
    }
    let arr = b
        .at(entries_lba * lba, len)
        .ok_or_else(|| format!("entry array at lba {entries_lba} outside what was read"))?;
    if crc32(arr) != u32_at(h, 88) {
        return Err("entry array crc mismatch".into());
    }
    let mut parts = Vec::new();
    for e in arr.chunks_exact(esize as usize) {
        if e[..16].iter().all(|&x| x == 0) {
            continue;
        }
        let (s, l) = (u64_at(e, 32), u64_at(e, 40));
        if s > l || l >= lbas {
            continue;
        }
        parts.push(Part {
            start: s * lba,
            len: (l - s + 1) * lba,
        });
    }
    Ok(parts)
}

/// The four primary entries of a plain MBR (512-byte sectors), inside the device.
fn mbr_parts(m: &[u8], size: u64, notes: &mut Vec<String>) -> Vec<Part> {
    let mut parts = Vec::new();
    for i in 0..4 {
        let e = &m[446 + i * 16..446 + (i + 1) * 16];
        let kind = e[4];
        let (s, n) = (u32_at(e, 8) as u64 * 512, u32_at(e, 12) as u64 * 512);
        if kind == 0 || n == 0 {
            continue;
        }
        if matches!(kind, 0x05 | 0x0F | 0x85) {
            notes.push(format!(
                "mbr entry {} is extended: its logical partitions are not read",
                i + 1
            ));
        }
        if s == 0 || s >= size {
            notes.push(format!("mbr entry {} starts outside the device", i + 1));
            continue;
        }
        parts.push(Part {
            start: s,
            len: n.min(size - s),
        });
    }
    parts
}

/// A byte range `[start, end)` of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// The ranges the `metadata` policy zeroes on a device of `size` bytes with `parts`:
/// first and last MiB of the device and of each partition (inside the partition), the
/// btrfs mirrors of each, aligned outward to [`ALIGN`], clipped to `size`, merged.
pub fn plan(size: u64, parts: &[Part]) -> Vec<Range> {
    let mut v = Vec::new();
    let whole = Part {
        start: 0,
        len: size,
    };
    for p in std::iter::once(&whole).chain(parts) {
        let end = p.start.saturating_add(p.len).min(size);
        if p.start >= end {
            continue;
        }
        v.push((p.start, p.start.saturating_add(WINDOW).min(end)));
        v.push((end.saturating_sub(WINDOW).max(p.start), end));
        for m in BTRFS_MIRRORS {
            let at = p.start.saturating_add(m);
            if at.saturating_add(BTRFS_SUPER) <= end {
                v.push((at, at + BTRFS_SUPER));
            }
        }
    }
    let mut r: Vec<Range> = v
        .into_iter()
        .map(|(s, e)| Range {
            start: s / ALIGN * ALIGN,
            end: e.div_ceil(ALIGN).saturating_mul(ALIGN).min(size),
        })
        .filter(|r| !r.is_empty())
        .collect();
    r.sort();
    let mut out: Vec<Range> = Vec::with_capacity(r.len());
    for x in r {
        match out.last_mut() {
            Some(l) if x.start <= l.end => l.end = l.end.max(x.end),
            _ => out.push(x),
        }
    }
    out
}

#[cfg(test)]
#[path = "parttable_tests.rs"]
mod tests;
