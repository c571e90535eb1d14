//! Fuzz TFTP option negotiation and the transfer state machine: an RRQ's options (from
//! `packet::parse`) → `transfer::negotiate` for a file size and server limits taken from
//! the input → the OACK we would send (must parse back as an OACK) → `Transfer` driven
//! by a stream of ACKs, peer errors and timeouts from the rest of the input. Checks:
//! negotiated values within the limits, every DATA range inside the file, block numbers
//! in order, the transfer ends. Any panic is a bug.
//!
//! Input: 8 bytes of parameters, then an RRQ datagram, then `0xff 0xff`, then events
//! (2 bytes each: `0..=0xfffd` ACK of that wire block number, `0xfffe` timeout,
//! `0xffff` peer error).
#![no_main]

use std::time::{Duration, Instant};

use bootplane::tftp::packet::{self, Packet};
use bootplane::tftp::transfer::{negotiate, Event, Limits, Send, Transfer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (params, rest) = data.split_at(8);
    let size = u64::from(u32::from_le_bytes([params[0], params[1], params[2], 0]));
    let limits = Limits {
        max_blksize: u16::from_le_bytes([params[3], params[4]]).max(8),
        max_windowsize: u16::from(params[5]).max(1),
        initial_rto: Duration::from_millis(250),
        min_rto: Duration::from_millis(20),
        max_rto: Duration::from_millis(4000),
        max_retries: u32::from(params[6] % 8),
        max_timeout: Duration::from_secs(u64::from(params[7]).max(1)),
        min_rate: 512,
        rate_grace: Duration::from_secs(10),
    };
    let split = rest
        .windows(2)
        .position(|w| w == [0xff, 0xff])
        .unwrap_or(rest.len());
    let (pkt, events) = rest.split_at(split);
    let events = events.get(2..).unwrap_or_default();
    let Ok(Packet::Rrq(req)) = packet::parse(pkt) else {
        return;
    };
    let Ok(n) = negotiate(&req.options, size, &limits) else {
        return;
    };
    assert!(n.blksize >= 8 && n.blksize <= limits.max_blksize.max(512) && n.blksize <= 65464);
    assert!(n.windowsize >= 1 && n.windowsize <= limits.max_windowsize.max(1));
    if let Some(t) = n.timeout {
        assert!(t >= Duration::from_secs(1) && t <= limits.max_timeout);
    }
    if !n.oack.is_empty() {
        assert_eq!(packet::parse(&packet::oack(&n.oack)), Ok(Packet::Oack));
    }
    let mut t = Transfer::new(size, &n, &limits);
    let mut now = Instant::now();
    let check = |t: &Transfer, s: Option<Send>| {
        if let Some(Send::Blocks { first, last }) = s {
            assert!(first >= 1 && first <= last && last <= t.nblocks(), "{first}..={last}");
            let r = t.block_range(last);
            assert!(r.start <= r.end && r.end as u64 <= size);
            assert!(r.end - r.start <= t.blksize());
        }
    };
    let step = t.start(now);
    check(&t, step.send);
    for ev in events.chunks_exact(2) {
        if t.is_done() {
            break;
        }
        now += Duration::from_millis(u64::from(ev[1] % 16));
        let ev = match u16::from_be_bytes([ev[0], ev[1]]) {
            0xfffe => Event::Timeout,
            0xffff => Event::PeerError {
                code: 0,
                message: String::new(),
            },
            b => Event::Ack(b),
        };
        let step = t.on_event(ev, now);
        check(&t, step.send);
        assert!(t.rto() <= Duration::from_secs(255).max(limits.max_rto));
    }
});
