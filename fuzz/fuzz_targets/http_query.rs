//! Fuzz the `/ipxe/script` query string (percent-decoding, uuid/mac/server/token
//! parameters, the identity check) through `BootHttp::handle`, and the other routes'
//! path parameters: the input is the request target after a route prefix chosen by the
//! first byte. Response invariants in `common/boot_app.rs`.
#![no_main]

#[path = "common/boot_app.rs"]
mod boot_app;

use http::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let Ok(rest) = std::str::from_utf8(rest) else { return };
    let prefix = match sel % 4 {
        0 | 1 => "/ipxe/script?",
        2 => "/ignition/",
        _ => "/assets/",
    };
    let Ok(req) = Request::get(format!("{prefix}{rest}")).body(()) else { return };
    boot_app::handle(req, boot_app::client(sel & 4 != 0));
});
