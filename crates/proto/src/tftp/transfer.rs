//! The pure read-transfer state machine: option negotiation (RFC 2347/2348/2349/7440)
//! and `event + state -> step` for one RRQ. No sockets, no clocks: the socket layer
//! feeds ACKs, peer errors and timeouts, and performs the returned sends.
//!
//! Blocks are numbered absolutely from 1 (u64) inside the machine; the wire number is
//! the low 16 bits, so files over 65535 blocks roll over to 0 as tftp-hpa, atftp,
//! curl and iPXE expect. Retransmission is go-back-N over the window (RFC 7440): an
//! ACK inside the outstanding window slides it and sends the next window; an ACK for
//! a block already acknowledged (duplicate or late) is ignored, so duplicated ACKs
//! never duplicate data (no Sorcerer's Apprentice); only a timeout retransmits.

use std::time::{Duration, Instant};

use super::packet::ErrorCode;

/// Server-side limits applied to what a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest blksize granted (already capped by the path MTU by the caller).
    pub max_blksize: u16,
    /// Largest windowsize granted.
    pub max_windowsize: u16,
    /// Retransmission timeout before the first RTT sample, when the client sends
    /// no `timeout` option.
    pub initial_rto: Duration,
    /// Floor of the RTT-derived timeout.
    pub min_rto: Duration,
    /// Cap of the exponential backoff.
    pub max_rto: Duration,
    /// Consecutive timeouts before the transfer is abandoned.
    pub max_retries: u32,
    /// Largest `timeout` option accepted; a larger one is declined.
    pub max_timeout: Duration,
    /// Smallest average rate (acknowledged bytes a second) a transfer must keep once
    /// older than `rate_grace`, checked when an ACK moves it forward (a client that
    /// stops acknowledging is ended by `max_retries`); 0 = no minimum. Without it a
    /// client acknowledging one small block just before each timeout holds its slot
    /// for days.
    pub min_rate: u64,
    /// Time a transfer gets before `min_rate` applies (counted in its allowance, so a
    /// fast start also covers a later stall).
    pub rate_grace: Duration,
}

/// The outcome of option negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub blksize: u16,
    pub windowsize: u16,
    /// Retransmission timeout asked for by the client (`timeout` option).
    pub timeout: Option<Duration>,
    /// Options to acknowledge in an OACK; empty means no OACK (RFC 2347: a client
    /// that sent no recognised options gets DATA 1 directly).
    pub oack: Vec<(&'static str, String)>,
}

/// Negotiate the options of a read request for a file of `size` bytes (as sent,
/// i.e. after netascii conversion). Unknown options are ignored; a malformed or
/// out-of-range value of a known option refuses the request with error 8.
///
/// A `timeout` above `limits.max_timeout` is declined, not reduced: RFC 2349 says the
/// value in the OACK "must match the value specified by the client", so the server may
/// only accept it as is or leave it out (RFC 2347: options not acknowledged are not in
/// effect). Declined, the transfer uses the server's adaptive retransmission timeout;
/// honoured, `timeout=255` held a stalled transfer's slot for half an hour.
pub fn negotiate(
    options: &[(String, String)],
    size: u64,
    limits: &Limits,
) -> Result<Negotiated, (ErrorCode, String)> {
    let mut n = Negotiated {
        blksize: 512,
        windowsize: 1,
        timeout: None,
        oack: Vec::new(),
    };
    let mut seen: Vec<&str> = Vec::new();
    let refuse = |name: &str, value: &str| {
        (
            ErrorCode::OptionRefused,
            format!("invalid {name} value {value:?}"),
        )
    };
    for (name, value) in options {
        let name = name.as_str();
        if seen.contains(&name) {
            continue; // first occurrence wins
        }
        seen.push(name);
        match name {
            "blksize" => {
                let v: u32 = value.trim().parse().map_err(|_| refuse(name, value))?;
                if v < 8 {
                    return Err(refuse(name, value));
                }
                // Values above 65464 are capped (RFC 2348 lets the server answer smaller).
                let v = v.min(65464).min(limits.max_blksize as u32) as u16;
                n.blksize = v;
                n.oack.push(("blksize", v.to_string()));
            }
            "tsize" => {
                let _: u64 = value.trim().parse().map_err(|_| refuse(name, value))?;
                // An empty file's tsize is left out of the OACK: curl (7.88) rejects
                // `tsize 0` as invalid and aborts; declining an option is allowed.
                if size > 0 {
                    n.oack.push(("tsize", size.to_string()));
                }
            }
            "timeout" => {
                let v: u32 = value.trim().parse().map_err(|_| refuse(name, value))?;
                if !(1..=255).contains(&v) {
                    return Err(refuse(name, value));
                }
                let t = Duration::from_secs(v as u64);
                if t <= limits.max_timeout {
                    n.timeout = Some(t);
                    n.oack.push(("timeout", v.to_string()));
                }
            }
            "windowsize" => {
                let v: u32 = value.trim().parse().map_err(|_| refuse(name, value))?;
                if !(1..=65535).contains(&v) {
                    return Err(refuse(name, value));
                }
                let v = (v as u16).min(limits.max_windowsize.max(1));
                n.windowsize = v;
                n.oack.push(("windowsize", v.to_string()));
            }
            _ => {}
        }
    }
    Ok(n)
}

/// What the socket layer must transmit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Send {
    /// The OACK (again).
    Oack,
    /// DATA for absolute blocks `first..=last`.
    Blocks { first: u64, last: u64 },
}

/// How a transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The last block was acknowledged.
    Complete,
    /// `max_retries` consecutive timeouts.
    TimedOut,
    /// The client sent an ERROR (code 8 = it rejected our OACK).
    PeerError { code: u16, message: String },
    /// The transfer fell below [`Limits::min_rate`].
    TooSlow,
}

/// Result of one event: what to send and whether the transfer ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    pub send: Option<Send>,
    /// Number of packets in `send` that are retransmissions.
    pub retransmitted: u64,
    pub outcome: Option<Outcome>,
}

/// Input to the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Ack(u16),
    PeerError { code: u16, message: String },
    Timeout,
}

/// State of one read transfer.
#[derive(Debug, Clone)]
pub struct Transfer {
    len: u64,
    blksize: u64,
    window: u64,
    /// Number of DATA blocks (the last one is shorter than blksize, possibly empty).
    nblocks: u64,
    awaiting_oack_ack: bool,
    /// Lowest unacknowledged block.
    base: u64,
    /// Highest block sent so far (base-1 when nothing is outstanding).
    sent: u64,
    /// Retransmission timeout currently armed (after backoff).
    rto: Duration,
    /// Timeout without backoff: the client's `timeout`, or the RTT estimate.
    base_rto: Duration,
    min_rto: Duration,
    max_rto: Duration,
    /// RTT estimation (Jacobson/Karels); off when the client fixed `timeout`.
    adaptive: bool,
    srtt: Option<Duration>,
    rttvar: Duration,
    /// When the outstanding window was first sent; `None` once it was retransmitted
    /// (Karn: no RTT sample from retransmitted data).
    sent_at: Option<Instant>,
    retries: u32,
    max_retries: u32,
    min_rate: u64,
    rate_grace: Duration,
    /// When the transfer started.
    started: Option<Instant>,
    /// A time before which the transfer cannot be too slow (the deadline its
    /// acknowledged bytes had bought when last computed; it only moves later), so an
    /// ACK costs one comparison until it is reached. None: no minimum rate.
    slow_after: Option<Instant>,
    done: bool,
}

impl Transfer {
    pub fn new(len: u64, n: &Negotiated, limits: &Limits) -> Transfer {
        let blksize = n.blksize as u64;
        let rto = n.timeout.unwrap_or(limits.initial_rto);
        Transfer {
            len,
            blksize,
            window: n.windowsize.max(1) as u64,
            nblocks: len / blksize + 1,
            awaiting_oack_ack: !n.oack.is_empty(),
            base: 1,
            sent: 0,
            rto,
            base_rto: rto,
            min_rto: limits.min_rto.min(rto),
            max_rto: limits.max_rto.max(rto),
            adaptive: n.timeout.is_none(),
            srtt: None,
            rttvar: Duration::ZERO,
            sent_at: None,
            retries: 0,
            max_retries: limits.max_retries,
            min_rate: limits.min_rate,
            rate_grace: limits.rate_grace,
            started: None,
            slow_after: None,
            done: false,
        }
    }

    /// The first transmission: the OACK, or the first window of DATA.
    pub fn start(&mut self, now: Instant) -> Step {
        self.sent_at = Some(now);
        self.started = Some(now);
        if self.min_rate > 0 {
            self.slow_after = Some(now + self.rate_grace);
        }
        if self.awaiting_oack_ack {
            Step {
                send: Some(Send::Oack),
                ..Step::default()
            }
        } else {
            Step {
                send: Some(self.send_window()),
                ..Step::default()
            }
        }
    }

    fn send_window(&mut self) -> Send {
        let last = (self.base + self.window - 1).min(self.nblocks);
        self.sent = last;
        Send::Blocks {
            first: self.base,
            last,
        }
    }

    /// Current retransmission timeout (the socket layer arms its timer with it after every send).
    pub fn rto(&self) -> Duration {
        self.rto
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn blksize(&self) -> usize {
        self.blksize as usize
    }

    pub fn nblocks(&self) -> u64 {
        self.nblocks
    }

    /// Byte range of absolute block `b` within the data.
    pub fn block_range(&self, b: u64) -> std::ops::Range<usize> {
        let start = ((b - 1) * self.blksize).min(self.len);
        let end = (b * self.blksize).min(self.len);
        start as usize..end as usize
    }

    /// Map a wire ACK number to an absolute block in `base-1 ..= sent`, if any.
    fn ack_to_abs(&self, wire: u16) -> Option<u64> {
        let floor = self.base - 1;
        let delta = wire.wrapping_sub(floor as u16) as u64;
        let abs = floor + delta;
        (abs <= self.sent).then_some(abs)
    }

    pub fn on_event(&mut self, ev: Event, now: Instant) -> Step {
        if self.done {
            return Step::default();
        }
        match ev {
            Event::PeerError { code, message } => self.finish(Outcome::PeerError { code, message }),
            Event::Timeout => {
                self.retries += 1;
                if self.retries > self.max_retries {
                    return self.finish(Outcome::TimedOut);
                }
                self.sent_at = None;
                self.rto = (self.rto * 2).min(self.max_rto);
                if self.awaiting_oack_ack {
                    return Step {
                        send: Some(Send::Oack),
                        retransmitted: 1,
                        outcome: None,
                    };
                }
                let first = self.base;
                let last = self.sent.max(first);
                Step {
                    send: Some(Send::Blocks { first, last }),
                    retransmitted: last - first + 1,
                    outcome: None,
                }
            }
            Event::Ack(wire) => {
                if self.awaiting_oack_ack {
                    if wire != 0 {
                        return Step::default();
                    }
                    self.awaiting_oack_ack = false;
                    self.progress(now);
                    if self.too_slow(now) {
                        return self.finish(Outcome::TooSlow);
                    }
                    return Step {
                        send: Some(self.send_window()),
                        ..Step::default()
                    };
                }
                let Some(abs) = self.ack_to_abs(wire) else {
                    return Step::default();
                };
                if abs < self.base {
                    // Duplicate or late ACK: never triggers a resend.
                    return Step::default();
                }
                self.base = abs + 1;
                self.progress(now);
                if self.base > self.nblocks {
                    return self.finish(Outcome::Complete);
                }
                if self.too_slow(now) {
                    return self.finish(Outcome::TooSlow);
                }
                Step {
                    send: Some(self.send_window()),
                    ..Step::default()
                }
            }
        }
    }

    /// An ACK moved the transfer forward: take an RTT sample (Karn), reset backoff.
    fn progress(&mut self, now: Instant) {
        if let (true, Some(t0)) = (self.adaptive, self.sent_at) {
            let sample = now.saturating_duration_since(t0);
            match self.srtt {
                None => {
                    self.srtt = Some(sample);
                    self.rttvar = sample / 2;
                }
                Some(srtt) => {
                    let diff = srtt.abs_diff(sample);
                    self.rttvar = (self.rttvar * 3 + diff) / 4;
                    self.srtt = Some((srtt * 7 + sample) / 8);
                }
            }
            let est = self.srtt.unwrap_or(sample) + self.rttvar * 4;
            self.base_rto = est.clamp(self.min_rto, self.max_rto);
        }
        self.sent_at = Some(now);
        self.retries = 0;
        self.rto = self.base_rto;
    }

    /// Whether the transfer is below its minimum rate at `now`: older than its grace
    /// plus the time its acknowledged bytes pay for at `min_rate`.
    fn too_slow(&mut self, now: Instant) -> bool {
        let (Some(after), Some(t0)) = (self.slow_after, self.started) else {
            return false;
        };
        if now <= after {
            return false;
        }
        let acked = ((self.base - 1) * self.blksize).min(self.len);
        let bought = Duration::from_secs_f64(acked as f64 / self.min_rate as f64);
        let after = t0 + self.rate_grace + bought;
        self.slow_after = Some(after);
        now > after
    }

    fn finish(&mut self, o: Outcome) -> Step {
        self.done = true;
        Step {
            send: None,
            retransmitted: 0,
            outcome: Some(o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        Instant::now()
    }

    fn limits() -> Limits {
        Limits {
            max_blksize: 65464,
            max_windowsize: 64,
            initial_rto: Duration::from_millis(100),
            min_rto: Duration::from_millis(100),
            max_rto: Duration::from_millis(800),
            max_retries: 3,
            max_timeout: Duration::from_secs(5),
            min_rate: 0,
            rate_grace: Duration::from_secs(10),
        }
    }

    fn opts(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn plain(len: u64) -> Transfer {
        let n = negotiate(&[], len, &limits()).unwrap();
        Transfer::new(len, &n, &limits())
    }

    #[test]
    fn no_options_no_oack() {
        let n = negotiate(&opts(&[("foo", "bar")]), 10, &limits()).unwrap();
        assert!(n.oack.is_empty());
        assert_eq!(n.blksize, 512);
        let mut t = Transfer::new(10, &n, &limits());
        assert_eq!(
            t.start(now()).send,
            Some(Send::Blocks { first: 1, last: 1 })
        );
    }

    #[test]
    fn option_values() {
        let l = limits();
        let n = negotiate(
            &opts(&[
                ("blksize", "1468"),
                ("tsize", "0"),
                ("timeout", "3"),
                ("windowsize", "16"),
            ]),
            99,
            &l,
        )
        .unwrap();
        assert_eq!(n.blksize, 1468);
        assert_eq!(n.windowsize, 16);
        assert_eq!(n.timeout, Some(Duration::from_secs(3)));
        assert_eq!(
            n.oack,
            vec![
                ("blksize", "1468".into()),
                ("tsize", "99".into()),
                ("timeout", "3".into()),
                ("windowsize", "16".into())
            ]
        );
        // capped
        let n = negotiate(
            &opts(&[("blksize", "70000"), ("windowsize", "1000")]),
            0,
            &Limits {
                max_blksize: 1428,
                ..l
            },
        )
        .unwrap();
        assert_eq!((n.blksize, n.windowsize), (1428, 64));
        // refused
        for (k, v) in [
            ("blksize", "7"),
            ("blksize", "x"),
            ("blksize", "-1"),
            ("timeout", "0"),
            ("timeout", "256"),
            ("windowsize", "0"),
            ("tsize", "abc"),
        ] {
            let e = negotiate(&opts(&[(k, v)]), 0, &l).unwrap_err();
            assert_eq!(e.0, ErrorCode::OptionRefused, "{k}={v}");
        }
        // tsize of an empty file is not acknowledged (curl rejects "tsize 0")
        assert!(negotiate(&opts(&[("tsize", "0")]), 0, &l)
            .unwrap()
            .oack
            .is_empty());
        // duplicates: first wins
        let n = negotiate(&opts(&[("blksize", "1024"), ("blksize", "9")]), 0, &l).unwrap();
        assert_eq!(n.blksize, 1024);
    }

    #[test]
    fn sizes_give_right_block_counts() {
        assert_eq!(plain(0).nblocks(), 1);
        assert_eq!(plain(511).nblocks(), 1);
        assert_eq!(plain(512).nblocks(), 2);
        assert_eq!(plain(513).nblocks(), 2);
        let t = plain(513);
        assert_eq!(t.block_range(1), 0..512);
        assert_eq!(t.block_range(2), 512..513);
        let t = plain(512);
        assert_eq!(t.block_range(2), 512..512);
    }

    #[test]
    fn lockstep_transfer_and_duplicate_acks() {
        let mut t = plain(1024);
        assert_eq!(
            t.start(now()).send,
            Some(Send::Blocks { first: 1, last: 1 })
        );
        assert_eq!(
            t.on_event(Event::Ack(1), now()).send,
            Some(Send::Blocks { first: 2, last: 2 })
        );
        // duplicate ACK 1: no resend (Sorcerer's Apprentice)
        assert_eq!(t.on_event(Event::Ack(1), now()), Step::default());
        assert_eq!(t.on_event(Event::Ack(0), now()), Step::default());
        // ACK from the future: ignored
        assert_eq!(t.on_event(Event::Ack(7), now()), Step::default());
        assert_eq!(
            t.on_event(Event::Ack(2), now()).send,
            Some(Send::Blocks { first: 3, last: 3 })
        );
        let s = t.on_event(Event::Ack(3), now());
        assert_eq!(s.outcome, Some(Outcome::Complete));
        assert!(t.is_done());
        assert_eq!(t.on_event(Event::Ack(3), now()), Step::default());
    }

    #[test]
    fn oack_flow_and_rejection() {
        let l = limits();
        let n = negotiate(&opts(&[("blksize", "1024")]), 3000, &l).unwrap();
        let mut t = Transfer::new(3000, &n, &l);
        assert_eq!(t.start(now()).send, Some(Send::Oack));
        assert_eq!(t.on_event(Event::Ack(5), now()), Step::default());
        let s = t.on_event(Event::Timeout, now());
        assert_eq!((s.send, s.retransmitted), (Some(Send::Oack), 1));
        assert_eq!(
            t.on_event(Event::Ack(0), now()).send,
            Some(Send::Blocks { first: 1, last: 1 })
        );
        // a duplicate ACK 0 after the OACK was acknowledged is ignored
        assert_eq!(t.on_event(Event::Ack(0), now()), Step::default());

        let mut t = Transfer::new(3000, &n, &l);
        t.start(now());
        let s = t.on_event(
            Event::PeerError {
                code: 8,
                message: "no".into(),
            },
            now(),
        );
        assert_eq!(
            s.outcome,
            Some(Outcome::PeerError {
                code: 8,
                message: "no".into()
            })
        );
    }

    #[test]
    fn windowed_go_back_n() {
        let l = limits();
        let n = negotiate(&opts(&[("windowsize", "4")]), 512 * 10, &l).unwrap();
        let mut t = Transfer::new(512 * 10, &n, &l);
        assert_eq!(t.nblocks(), 11);
        t.start(now());
        assert_eq!(
            t.on_event(Event::Ack(0), now()).send,
            Some(Send::Blocks { first: 1, last: 4 })
        );
        // receiver saw a gap after 2: resend from 3
        assert_eq!(
            t.on_event(Event::Ack(2), now()).send,
            Some(Send::Blocks { first: 3, last: 6 })
        );
        // timeout resends the outstanding window
        let s = t.on_event(Event::Timeout, now());
        assert_eq!(
            (s.send, s.retransmitted),
            (Some(Send::Blocks { first: 3, last: 6 }), 4)
        );
        assert_eq!(
            t.on_event(Event::Ack(6), now()).send,
            Some(Send::Blocks { first: 7, last: 10 })
        );
        assert_eq!(
            t.on_event(Event::Ack(10), now()).send,
            Some(Send::Blocks {
                first: 11,
                last: 11
            })
        );
        assert_eq!(
            t.on_event(Event::Ack(11), now()).outcome,
            Some(Outcome::Complete)
        );
    }

    #[test]
    fn rollover_past_65535() {
        let len = 512 * 70_000u64;
        let mut t = plain(len);
        t.start(now());
        for b in 1..=70_000u64 {
            let s = t.on_event(Event::Ack(b as u16), now());
            assert_eq!(
                s.send,
                Some(Send::Blocks {
                    first: b + 1,
                    last: b + 1
                }),
                "block {b}"
            );
            // a stale ACK from 65536 blocks ago is not confused with the current one
            if b > 3 {
                assert_eq!(
                    t.on_event(Event::Ack((b - 1) as u16), now()),
                    Step::default()
                );
            }
        }
        assert_eq!(
            t.on_event(Event::Ack(70_001u64 as u16), now()).outcome,
            Some(Outcome::Complete)
        );
    }

    #[test]
    fn a_transfer_below_the_minimum_rate_is_ended() {
        let l = Limits {
            min_rate: 1000,
            rate_grace: Duration::from_secs(10),
            max_rto: Duration::from_secs(4),
            ..limits()
        };
        let sec = Duration::from_secs;
        // blksize 8, one ACK every 3.9 s: never a timeout, 2 bytes a second
        let n = negotiate(&opts(&[("blksize", "8")]), 1 << 20, &l).unwrap();
        let mut t = Transfer::new(1 << 20, &n, &l);
        let t0 = Instant::now();
        t.start(t0);
        let mut at = t0;
        let mut wire = 0u16;
        let ended = loop {
            at += Duration::from_millis(3900);
            let step = t.on_event(Event::Ack(wire), at);
            wire += 1;
            if step.outcome.is_some() {
                break (step.outcome, at - t0);
            }
            assert!(at - t0 < sec(60), "a trickle held its slot for a minute");
        };
        assert_eq!(ended.0, Some(Outcome::TooSlow));
        assert!(ended.1 > sec(10) && ended.1 < sec(12), "{:?}", ended.1);
        // a client that stopped acknowledging is ended by its retries, as before (the
        // rate is checked on ACKs only: a dead client gets no ERROR, counts as a timeout)
        let mut t = Transfer::new(1 << 20, &n, &l);
        t.start(t0);
        for s in [9, 11, 13] {
            assert_eq!(t.on_event(Event::Timeout, t0 + sec(s)).outcome, None);
        }
        assert_eq!(
            t.on_event(Event::Timeout, t0 + sec(15)).outcome,
            Some(Outcome::TimedOut)
        );
        // a fast start pays for a later stall: 100 kB acknowledged in 1 s buys 100 s more
        let n = negotiate(&opts(&[("blksize", "10000")]), 200_000, &l).unwrap();
        let mut t = Transfer::new(200_000, &n, &l);
        t.start(t0);
        for b in 0..=10u16 {
            let s = t.on_event(Event::Ack(b), t0 + Duration::from_millis(100 * b as u64));
            assert_eq!(s.outcome, None);
        }
        // (ACK 11: 110 kB, due by 10 + 110 s; ACK 12: 120 kB, due by 130 s)
        assert_eq!(t.on_event(Event::Ack(11), t0 + sec(100)).outcome, None);
        assert_eq!(
            t.on_event(Event::Ack(12), t0 + sec(140)).outcome,
            Some(Outcome::TooSlow)
        );
        // and a transfer that completes late still completes; 0 is no minimum
        let n = negotiate(&[], 100, &l).unwrap();
        let mut t = Transfer::new(100, &n, &l);
        t.start(t0);
        assert_eq!(
            t.on_event(Event::Ack(1), t0 + sec(3600)).outcome,
            Some(Outcome::Complete)
        );
        let l0 = Limits { min_rate: 0, ..l };
        let n = negotiate(&[], 10_000, &l0).unwrap();
        let mut t = Transfer::new(10_000, &n, &l0);
        t.start(t0);
        assert_eq!(t.on_event(Event::Ack(1), t0 + sec(3600)).outcome, None);
    }

    #[test]
    fn backoff_and_give_up() {
        let mut t = plain(100);
        t.start(now());
        assert_eq!(t.rto(), Duration::from_millis(100));
        t.on_event(Event::Timeout, now());
        assert_eq!(t.rto(), Duration::from_millis(200));
        t.on_event(Event::Timeout, now());
        t.on_event(Event::Timeout, now());
        assert_eq!(t.rto(), Duration::from_millis(800));
        assert_eq!(
            t.on_event(Event::Timeout, now()).outcome,
            Some(Outcome::TimedOut)
        );
    }

    #[test]
    fn rto_follows_rtt_with_floor_and_karn() {
        let l = Limits {
            min_rto: Duration::from_millis(10),
            ..limits()
        };
        let mut t = Transfer::new(512 * 10, &negotiate(&[], 0, &l).unwrap(), &l);
        let t0 = Instant::now();
        t.start(t0);
        assert_eq!(t.rto(), Duration::from_millis(100));
        // fast ACKs: the timeout falls to the floor
        for b in 1..=5u16 {
            t.on_event(Event::Ack(b), t0 + Duration::from_micros(200 * b as u64));
        }
        assert_eq!(t.rto(), Duration::from_millis(10));
        // a slow RTT raises it
        let mut at = t0 + Duration::from_millis(1);
        for b in 6..=8u16 {
            at += Duration::from_millis(40);
            t.on_event(Event::Ack(b), at);
        }
        assert!(t.rto() > Duration::from_millis(40), "{:?}", t.rto());
        // after a retransmission no sample is taken (Karn), backoff is reset on progress
        let before = t.base_rto;
        t.on_event(Event::Timeout, at);
        t.on_event(Event::Ack(9), at + Duration::from_secs(3));
        assert_eq!(t.base_rto, before);
    }

    #[test]
    fn a_timeout_above_the_maximum_is_declined() {
        let l = limits();
        let n = negotiate(&opts(&[("timeout", "255"), ("blksize", "1024")]), 1, &l).unwrap();
        assert_eq!(n.timeout, None);
        assert_eq!(n.oack, vec![("blksize", "1024".into())]);
        let t = Transfer::new(1, &n, &l);
        assert_eq!(t.rto(), l.initial_rto);
        // alone, it leaves nothing to acknowledge: DATA 1 comes without an OACK
        let n = negotiate(&opts(&[("timeout", "6")]), 1, &l).unwrap();
        assert!(n.oack.is_empty());
        let n = negotiate(&opts(&[("timeout", "5")]), 1, &l).unwrap();
        assert_eq!(n.oack, vec![("timeout", "5".into())]);
    }

    #[test]
    fn client_timeout_option_sets_rto() {
        let l = limits();
        let n = negotiate(&opts(&[("timeout", "2")]), 1, &l).unwrap();
        let t = Transfer::new(1, &n, &l);
        assert_eq!(t.rto(), Duration::from_secs(2));
    }
}
