//! Fuzz RFC 9110 conditionals and ranges (`files::plan`, pure): `If-Match`,
//! `If-None-Match`, `If-Modified-Since`, `If-Unmodified-Since`, `Range`, `If-Range`
//! against a file of a length taken from the input. Checks: partial ranges are
//! inclusive, ordered (start <= end), inside the file, at most `MAX_RANGES`.
//!
//! Input: 1 flag byte (bit 0: HEAD instead of GET), 3 bytes of file length, 1 byte of
//! mtime, then the six header values separated by `\n` in the order above (an absent
//! line is an absent header; `\x01` alone also means absent).
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use bootplane::http::files::{plan, Conditions, FileMeta, Plan, MAX_RANGES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let Ok(text) = std::str::from_utf8(&data[5..]) else { return };
    let is_get = data[0] & 1 == 0;
    let len = u64::from(u32::from_le_bytes([data[1], data[2], data[3], 0]));
    let mtime = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + u64::from(data[4]) * 86_400);
    let meta = FileMeta::new(len, mtime);
    let mut h = text.split('\n').map(|s| (s != "\x01").then_some(s));
    let mut next = || h.next().flatten();
    let c = Conditions {
        if_match: next(),
        if_none_match: next(),
        if_modified_since: next(),
        if_unmodified_since: next(),
        range: next(),
        if_range: next(),
    };
    let p = plan(is_get, &c, &meta);
    if let Plan::Partial(r) = &p {
        assert!(is_get, "ranges on HEAD");
        assert!(!r.is_empty() && r.len() <= MAX_RANGES);
        for &(s, e) in r {
            assert!(s <= e && e < len, "range {s}-{e} of {len}");
        }
    }
    // The same request with the etag and date the file reports must plan the same.
    assert_eq!(plan(is_get, &c, &meta), p);
    let _ = meta.last_modified();
});
