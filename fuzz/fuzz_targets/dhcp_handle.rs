//! Fuzz the DHCP packet handler: raw bytes → decode → `Server::handle` (proxy and
//! authoritative, ports 67 and 4011, state kept across inputs so pools fill up,
//! expire and get reclaimed) → encode the reply. Any panic is a bug.
//!
//! `scripts/fuzz.sh 600 dhcp_handle`, or `cargo +nightly fuzz run dhcp_handle fuzz/seeds/dhcp_handle`
//! (from the repo root). Without
//! cargo-fuzz, the same build by hand (from `fuzz/`):
//! `RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4
//! -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
//! -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares
//! --cfg fuzzing -Cdebug-assertions -Coverflow-checks" cargo +nightly build --release
//! --target x86_64-unknown-linux-gnu --bin dhcp_handle`, then
//! `target/x86_64-unknown-linux-gnu/release/dhcp_handle corpus/ seeds/dhcp_handle/ -max_total_time=600 -max_len=1500`.
//! Record: 2026-11-21, 600 s clean, 21.7 M executions (after fixing the one crash it
//! found: a repeated option 94, see `core::prevalidate`).
//! `seeds/dhcp_handle/` holds one packet per firmware/message shape (first byte: mode/port/clock selector).
#![no_main]

use std::cell::RefCell;
use std::net::{Ipv4Addr, SocketAddrV4};

use bootplane::config::Config;
use bootplane::dhcp::core::{decode, encode, Meta, Server};
use bootplane::dhcp::DhcpSettings;
use libfuzzer_sys::fuzz_target;

fn server(mode: &str) -> Server {
    let text = format!(
        "[http]\npublic_url = \"http://10.0.0.1:8080\"\n[dhcp]\nenabled = true\ninterface = \"fz0\"\nmode = \"{mode}\"\nrange = \"10.0.0.100-10.0.0.107\"\nrouter = \"10.0.0.1\"\nlease_time_secs = 10\n\
         [[dhcp.subnets]]\nnetwork = \"10.9.0.0/28\"\nranges = [\"10.9.0.2-10.9.0.5\"]\nexclude = [\"10.9.0.3\"]\n\
         [[dhcp.reservations]]\nmac = \"52:54:00:00:00:01\"\nip = \"10.0.0.50\"\nhostname = \"r1\"\n"
    );
    let cfg = Config::from_toml(&text).expect("fuzz config");
    Server::new(
        DhcpSettings::from_config(&cfg.dhcp, &cfg.public_http_url()).expect("fuzz settings"),
        Ipv4Addr::new(10, 0, 0, 1),
    )
}

thread_local! {
    static STATE: RefCell<(Server, Server, u64)> = RefCell::new((server("proxy"), server("authoritative"), 1_000_000));
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, pkt)) = data.split_first() else {
        return;
    };
    let Some(msg) = decode(pkt) else { return };
    STATE.with(|st| {
        let mut st = st.borrow_mut();
        st.2 += u64::from(sel >> 4); // time moves on: leases and offers expire
        let meta = Meta {
            now: st.2,
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, sel & 0x0f), 68),
            local_port: if sel & 1 == 0 { 67 } else { 4011 },
        };
        let srv = if sel & 2 == 0 { &mut st.0 } else { &mut st.1 };
        if let Some(r) = srv.handle(&msg, &meta).reply() {
            let _ = encode(&r.msg);
        }
        let _ = srv.table.take_journal();
    });
});
