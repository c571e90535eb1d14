//! Fuzz the wipe's partition-table reader and range planner
//! (`bootplane_probe::parttable::{parse, plan}`): the first 8 bytes pick the device size
//! (kept within 16 TiB), the rest is both the device's head and its tail (so a GPT's
//! primary and backup both come from the input). Any panic is a bug; beyond that: at
//! most 128 partitions from a GPT and 4 from an MBR, every partition inside the device,
//! and the planned ranges sorted, disjoint, 4 KiB aligned at their start, non-empty and
//! inside the device, covering its first and last byte.
//!
//! `scripts/fuzz.sh` runs it; seeds in `fuzz/seeds/wipe_parttable/` (GPT disks written
//! by sgdisk, a corrupt primary, an MBR with an extended entry).
#![no_main]

use bootplane_probe::parttable::{self, Scheme};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (sz, rest) = data.split_at(8);
    let mut b = [0u8; 8];
    b.copy_from_slice(sz);
    let size = u64::from_le_bytes(b) % (16u64 << 40);
    let t = parttable::parse(rest, rest, size);
    let most = match t.scheme {
        Scheme::Gpt { .. } => parttable::MAX_ENTRIES as usize,
        Scheme::Mbr => 4,
        Scheme::None => 0,
    };
    assert!(
        t.parts.len() <= most,
        "{:?}: {} parts",
        t.scheme,
        t.parts.len()
    );
    for p in &t.parts {
        assert!(
            p.len > 0 && p.start.checked_add(p.len).is_some_and(|e| e <= size),
            "{p:?} in {size}"
        );
    }
    let r = parttable::plan(size, &t.parts);
    for w in r.windows(2) {
        assert!(w[0].end < w[1].start, "{r:?}");
    }
    for x in &r {
        assert!(
            !x.is_empty() && x.end <= size && x.start % parttable::ALIGN == 0,
            "{x:?}"
        );
    }
    if size > 0 {
        assert_eq!(r.first().map(|x| x.start), Some(0));
        assert_eq!(r.last().map(|x| x.end), Some(size));
    }
});
