//! Property tests of the TFTP wire codec and option negotiation (`tftp::packet`,
//! `tftp::transfer::negotiate`): what a client encodes, the server parses back exactly;
//! what the server encodes (ERROR, OACK) parses back; negotiated values stay within the
//! server's limits. Random cases, bounded in number.

use std::time::Duration;

use bootplane::tftp::packet::{self, ErrorCode, Mode, Packet, Request};
use bootplane::tftp::transfer::{negotiate, Limits};
use proptest::prelude::*;

/// A client's encoding of a request (RFC 1350/2347).
fn encode_request(op: u16, r: &Request, mode_text: &str) -> Vec<u8> {
    let mut v = op.to_be_bytes().to_vec();
    for s in [r.filename.as_str(), mode_text] {
        v.extend_from_slice(s.as_bytes());
        v.push(0);
    }
    for (k, val) in &r.options {
        v.extend_from_slice(k.as_bytes());
        v.push(0);
        v.extend_from_slice(val.as_bytes());
        v.push(0);
    }
    v
}

/// Strings without NUL (a NUL ends a field on the wire).
fn field() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,40}"
}

fn limits() -> impl Strategy<Value = Limits> {
    (8u16..=65464, 1u16..=64).prop_map(|(b, w)| Limits {
        max_blksize: b,
        max_windowsize: w,
        initial_rto: Duration::from_millis(250),
        min_rto: Duration::from_millis(20),
        max_rto: Duration::from_millis(4000),
        max_retries: 6,
        max_timeout: Duration::from_secs(5),
        min_rate: 512,
        rate_grace: Duration::from_secs(10),
    })
}

fn option() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        Just("blksize".to_string()),
        Just("tsize".to_string()),
        Just("timeout".to_string()),
        Just("windowsize".to_string()),
        "[a-z]{1,10}",
    ];
    let value = prop_oneof![(0u32..70000).prop_map(|n| n.to_string()), "[0-9 a-z]{0,8}",];
    (name, value)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn requests_round_trip(
        filename in "[^\u{0}]{1,60}",
        netascii in any::<bool>(),
        upper in any::<bool>(),
        wrq in any::<bool>(),
        options in proptest::collection::vec(("[a-z]{1,12}", field()), 0..6),
    ) {
        let r = Request {
            filename,
            mode: if netascii { Mode::Netascii } else { Mode::Octet },
            options,
        };
        let mode_text = if upper { r.mode.to_string().to_uppercase() } else { r.mode.to_string() };
        let wire = encode_request(if wrq { packet::OP_WRQ } else { packet::OP_RRQ }, &r, &mode_text);
        let want = if wrq { Packet::Wrq(r.clone()) } else { Packet::Rrq(r.clone()) };
        // An empty option name ends the list (padding); the generator never makes one.
        prop_assert_eq!(packet::parse(&wire), Ok(want));
    }

    #[test]
    fn errors_and_oacks_round_trip(
        message in field(),
        code in 0u16..=8,
        opts in proptest::collection::vec(("[a-z]{1,12}", "[0-9]{1,6}"), 1..5),
    ) {
        let codes = [
            ErrorCode::NotDefined, ErrorCode::FileNotFound, ErrorCode::AccessViolation,
            ErrorCode::DiskFull, ErrorCode::IllegalOperation, ErrorCode::UnknownTid,
            ErrorCode::FileExists, ErrorCode::NoSuchUser, ErrorCode::OptionRefused,
        ];
        prop_assert_eq!(
            packet::parse(&packet::error(codes[code as usize], &message)),
            Ok(Packet::Error { code, message })
        );
        let pairs: Vec<(&str, String)> = opts.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let oack = packet::oack(&pairs);
        prop_assert_eq!(packet::parse(&oack), Ok(Packet::Oack));
        // `Packet::Oack` carries no options: check the bytes against RFC 2347's layout.
        let mut want = 6u16.to_be_bytes().to_vec();
        for (k, v) in &opts {
            want.extend_from_slice(k.as_bytes());
            want.push(0);
            want.extend_from_slice(v.as_bytes());
            want.push(0);
        }
        prop_assert_eq!(oack, want);
    }

    #[test]
    fn block_numbers_round_trip(block in any::<u16>()) {
        let mut data = packet::data_header(block).to_vec();
        data.extend_from_slice(b"payload");
        prop_assert_eq!(packet::parse(&data), Ok(Packet::Data { block }));
        let mut ack = packet::OP_ACK.to_be_bytes().to_vec();
        ack.extend_from_slice(&block.to_be_bytes());
        prop_assert_eq!(packet::parse(&ack), Ok(Packet::Ack { block }));
    }

    #[test]
    fn negotiation_stays_within_limits(
        options in proptest::collection::vec(option(), 0..6),
        size in 0u64..10_000_000,
        limits in limits(),
    ) {
        let Ok(n) = negotiate(&options, size, &limits) else { return Ok(()) };
        prop_assert!(n.blksize >= 8 && n.blksize <= limits.max_blksize.max(512));
        prop_assert!(n.windowsize >= 1 && n.windowsize <= limits.max_windowsize);
        prop_assert!(n.timeout.is_none_or(|t| t >= Duration::from_secs(1) && t <= Duration::from_secs(5)));
        // Every acknowledged option was asked for, once, and its OACK parses.
        for (k, _) in &n.oack {
            prop_assert!(options.iter().any(|(o, _)| o == k));
            prop_assert_eq!(n.oack.iter().filter(|(o, _)| o == k).count(), 1);
        }
        if !n.oack.is_empty() {
            prop_assert_eq!(packet::parse(&packet::oack(&n.oack)), Ok(Packet::Oack));
        }
        // Each answer keeps what RFC 2348/2349/7440 allow against the client's own value
        // (the first occurrence counts) and is what the transfer will use.
        for (k, v) in &n.oack {
            let asked = &options.iter().find(|(o, _)| o == k).unwrap().1;
            let asked: u64 = asked.trim().parse().unwrap();
            let v: u64 = v.parse().unwrap();
            match *k {
                "blksize" => prop_assert!(v <= asked && v == u64::from(n.blksize)),
                "windowsize" => prop_assert!(v <= asked && v == u64::from(n.windowsize)),
                "timeout" => prop_assert!(v == asked && n.timeout == Some(Duration::from_secs(v))),
                "tsize" => prop_assert!(v == size && size > 0),
                other => prop_assert!(false, "unknown option {} acknowledged", other),
            }
        }
        // A value other than the RFC 1350 default is only used when the OACK says so.
        let acked = |k: &str| n.oack.iter().any(|(o, _)| *o == k);
        prop_assert!(n.blksize == 512 || acked("blksize"));
        prop_assert!(n.windowsize == 1 || acked("windowsize"));
        prop_assert!(n.timeout.is_none() || acked("timeout"));
    }
}
