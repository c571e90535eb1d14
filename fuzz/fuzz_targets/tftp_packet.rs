//! Fuzz the TFTP wire codec the listener and the engines use: raw datagram →
//! `packet::parse` → for a read request, the path check (`files::sanitize`) the file
//! store applies; for an ERROR, the encoder round trip. Any panic is a bug.
//!
//! `scripts/fuzz.sh` runs it; seeds in `fuzz/seeds/tftp_packet/`.
#![no_main]

use bootplane::tftp::files::sanitize;
use bootplane::tftp::packet::{self, Packet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = packet::parse(data) else { return };
    match p {
        Packet::Rrq(r) | Packet::Wrq(r) => {
            assert!(!r.filename.contains('\0'));
            for (k, _) in &r.options {
                assert_eq!(k, &k.to_ascii_lowercase(), "option names are lower-cased");
            }
            if let Ok(parts) = sanitize(&r.filename) {
                assert!(!parts.is_empty());
                for c in &parts {
                    assert!(!c.is_empty() && c != "." && c != "..", "{c:?} escapes");
                    assert!(!c.contains('/') && !c.contains('\\'), "{c:?} has a separator");
                }
            }
        }
        Packet::Error { code, message } if !message.contains('\0') => {
            // What we would send back with the same code and text parses to the same packet.
            let mut wire = packet::error(packet::ErrorCode::NotDefined, &message);
            wire[2..4].copy_from_slice(&code.to_be_bytes());
            assert_eq!(
                packet::parse(&wire),
                Ok(Packet::Error { code, message })
            );
        }
        _ => {}
    }
});
