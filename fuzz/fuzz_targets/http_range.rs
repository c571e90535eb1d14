//! Fuzz RFC 9110 conditionals and ranges (`files::plan`, pure): `If-Match`,
//! `If-None-Match`, `If-Modified-Since`, `If-Unmodified-Since`, `Range`, `If-Range`
//! against a file of a length taken from the input. Checks: partial ranges are
//! inclusive, ordered (start <= end), inside the file, at most `MAX_RANGES`; the file's
//! own etag and date satisfy the conditionals that compare with them.
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
    assert_eq!(plan(is_get, &c, &meta), p, "deterministic");
    // The file's own validators (RFC 9110 section 13.1): its etag or date in
    // If-None-Match / If-Modified-Since is 304; in If-Match / If-Unmodified-Since or
    // If-Range it changes nothing about the input's Range.
    let (etag, date) = (meta.etag.as_str(), meta.last_modified());
    let own = |c: Conditions| plan(is_get, &c, &meta);
    let none = Conditions::default();
    assert_eq!(own(Conditions { if_none_match: Some(etag), ..none }), Plan::NotModified);
    assert_eq!(own(Conditions { if_modified_since: Some(&date), ..none }), Plan::NotModified);
    let ranged = Conditions { range: c.range, ..none };
    let want = own(ranged);
    assert_eq!(own(Conditions { if_match: Some(etag), ..ranged }), want);
    assert_eq!(own(Conditions { if_unmodified_since: Some(&date), ..ranged }), want);
    assert_eq!(own(Conditions { if_range: Some(etag), ..ranged }), want);
    assert_eq!(own(Conditions { if_range: Some(&date), ..ranged }), want);
});
