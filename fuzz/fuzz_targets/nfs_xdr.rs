//! Fuzz the NFSv3 client's reply decoding (`image::nfs`): the byte stream a server
//! sends → `read_record` (RPC record marking) → `parse_reply` (RPC reply header) → each
//! procedure's reply parser the client uses (portmapper GETPORT, MOUNT3 MNT, NFSv3
//! LOOKUP, GETATTR, FSINFO, READ). Checks: a READ never yields more than was asked,
//! FSINFO's read size stays within 4 KiB..1 MiB, GETPORT never yields port 0. Any
//! panic is a bug.
#![no_main]

use std::io::Cursor;

use bootplane::image::nfs::{
    parse_fsinfo, parse_getattr, parse_getport, parse_lookup, parse_mnt, parse_read,
    parse_reply, read_record,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut s = Cursor::new(data);
    for _ in 0..8 {
        let Ok(rec) = read_record(&mut s) else { return };
        assert!(rec.len() <= data.len());
        let Ok((_xid, body)) = parse_reply(rec) else { continue };
        if let Ok(Some(p)) = parse_getport(&body) {
            assert_ne!(p, 0);
        }
        let _ = parse_mnt(&body);
        let _ = parse_lookup(&body, "lookup");
        let _ = parse_getattr(&body, "getattr");
        if let Ok(rsize) = parse_fsinfo(&body) {
            assert!((4096..=1 << 20).contains(&rsize));
        }
        for count in [0u32, 1, 4096, 1 << 20] {
            if let Ok((d, _eof)) = parse_read(&body, count, "read") {
                assert!(d.len() <= count as usize && d.len() <= body.len());
            }
        }
    }
});
