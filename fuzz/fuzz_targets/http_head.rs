//! Fuzz the boot listener's request path as a connection sees it: raw bytes →
//! `conn::parse` (httparse heads, pipelined: parsed until the buffer is used up or an
//! error) → `BootHttp::handle` (routes, query string, identity, tokens, asset paths,
//! conditionals, ranges) → response invariants (see `common/boot_app.rs`).
//!
//! The first input byte picks the client address (the machine's own or another).
#![no_main]

#[path = "common/boot_app.rs"]
mod boot_app;

use bootplane::http::conn;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, raw)) = data.split_first() else { return };
    let client = boot_app::client(sel & 1 != 0);
    let mut buf = BytesMut::from(raw);
    for _ in 0..16 {
        let before = buf.len();
        match conn::parse(&mut buf) {
            Ok(Some(head)) => {
                assert!(buf.len() < before, "a parsed head consumes input");
                boot_app::handle(head.req, client);
                if head.has_body || !head.keep_alive {
                    break;
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
});
