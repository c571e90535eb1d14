//! TFTP wire format (RFC 1350 packets, RFC 2347 OACK): parse requests and
//! acknowledgements from untrusted bytes without panicking, and encode the packets
//! the server sends. Pure: no I/O.

use std::fmt;

pub const OP_RRQ: u16 = 1;
pub const OP_WRQ: u16 = 2;
pub(crate) const OP_DATA: u16 = 3;
pub const OP_ACK: u16 = 4;
pub(crate) const OP_ERROR: u16 = 5;
pub(crate) const OP_OACK: u16 = 6;

/// TFTP error codes (RFC 1350 section 5, RFC 2347 for 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    NotDefined = 0,
    FileNotFound = 1,
    AccessViolation = 2,
    DiskFull = 3,
    IllegalOperation = 4,
    UnknownTid = 5,
    FileExists = 6,
    NoSuchUser = 7,
    OptionRefused = 8,
}

/// Transfer mode of a request. `mail` is obsolete and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Octet,
    Netascii,
}

/// A read or write request: file name, mode and the options in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub filename: String,
    pub mode: Mode,
    /// Option names lower-cased; values as sent.
    pub options: Vec<(String, String)>,
}

/// A parsed packet. DATA payloads are not kept (a read-only server never accepts data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Rrq(Request),
    Wrq(Request),
    Data { block: u16 },
    Ack { block: u16 },
    Error { code: u16, message: String },
    Oack,
}

/// Why a datagram could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("truncated packet")]
    Truncated,
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    #[error("unterminated or non-utf8 string")]
    BadString,
    #[error("unsupported transfer mode {0:?}")]
    BadMode(String),
}

impl ParseError {
    /// The error code a server answers with, or `None` for a silent drop.
    pub(crate) fn reply_code(&self) -> Option<ErrorCode> {
        match self {
            ParseError::Truncated | ParseError::BadString => None,
            ParseError::UnknownOpcode(_) | ParseError::BadMode(_) => {
                Some(ErrorCode::IllegalOperation)
            }
        }
    }
}

fn take_str<'a>(buf: &'a [u8], pos: &mut usize) -> Result<&'a str, ParseError> {
    let rest = buf.get(*pos..).ok_or(ParseError::Truncated)?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or(ParseError::BadString)?;
    let s = std::str::from_utf8(&rest[..end]).map_err(|_| ParseError::BadString)?;
    *pos += end + 1;
    Ok(s)
}

fn parse_request(buf: &[u8]) -> Result<Request, ParseError> {
    let mut pos = 2;
    let filename = take_str(buf, &mut pos)?.to_string();
    let mode_s = take_str(buf, &mut pos)?;
    let mode = match mode_s.to_ascii_lowercase().as_str() {
        "octet" => Mode::Octet,
        "netascii" => Mode::Netascii,
        _ => return Err(ParseError::BadMode(mode_s.to_string())),
    };
    let mut options = Vec::new();
    // Options come in name/value pairs; a trailing unpaired string (some firmware
    // pads with NULs) ends the list.
    while pos < buf.len() {
        let Ok(name) = take_str(buf, &mut pos) else {
            break;
        };
        if name.is_empty() {
            break;
        }
        let Ok(value) = take_str(buf, &mut pos) else {
            break;
        };
        options.push((name.to_ascii_lowercase(), value.to_string()));
    }
    Ok(Request {
        filename,
        mode,
        options,
    })
}

/// Parse one datagram.
pub fn parse(buf: &[u8]) -> Result<Packet, ParseError> {
    if buf.len() < 2 {
        return Err(ParseError::Truncated);
    }
    let op = u16::from_be_bytes([buf[0], buf[1]]);
    let block = || -> Result<u16, ParseError> {
        buf.get(2..4)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(ParseError::Truncated)
    };
    match op {
        OP_RRQ => parse_request(buf).map(Packet::Rrq),
        OP_WRQ => parse_request(buf).map(Packet::Wrq),
        OP_DATA => Ok(Packet::Data { block: block()? }),
        OP_ACK => Ok(Packet::Ack { block: block()? }),
        OP_ERROR => {
            let code = block()?;
            let mut pos = 4;
            // Some clients omit the message terminator; accept what is there.
            let message = take_str(buf, &mut pos)
                .map(str::to_string)
                .unwrap_or_else(|_| {
                    String::from_utf8_lossy(buf.get(4..).unwrap_or_default()).into_owned()
                });
            Ok(Packet::Error { code, message })
        }
        OP_OACK => Ok(Packet::Oack),
        other => Err(ParseError::UnknownOpcode(other)),
    }
}

/// Encode an ERROR packet.
pub fn error(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + message.len());
    v.extend_from_slice(&OP_ERROR.to_be_bytes());
    v.extend_from_slice(&(code as u16).to_be_bytes());
    v.extend_from_slice(message.as_bytes());
    v.push(0);
    v
}

/// Encode an OACK packet.
pub fn oack(options: &[(&str, String)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&OP_OACK.to_be_bytes());
    for (k, val) in options {
        v.extend_from_slice(k.as_bytes());
        v.push(0);
        v.extend_from_slice(val.as_bytes());
        v.push(0);
    }
    v
}

/// The 4-byte header of a DATA packet.
pub fn data_header(block: u16) -> [u8; 4] {
    let b = block.to_be_bytes();
    let o = OP_DATA.to_be_bytes();
    [o[0], o[1], b[0], b[1]]
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Octet => "octet",
            Mode::Netascii => "netascii",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&str]) -> Vec<u8> {
        let mut v = OP_RRQ.to_be_bytes().to_vec();
        for p in parts {
            v.extend_from_slice(p.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn parses_rrq_with_options() {
        let p = parse(&rrq(&[
            "ipxe.efi", "OCTET", "BlkSize", "1468", "tsize", "0",
        ]))
        .unwrap();
        assert_eq!(
            p,
            Packet::Rrq(Request {
                filename: "ipxe.efi".into(),
                mode: Mode::Octet,
                options: vec![
                    ("blksize".into(), "1468".into()),
                    ("tsize".into(), "0".into())
                ],
            })
        );
    }

    #[test]
    fn netascii_and_bad_mode() {
        assert!(matches!(
            parse(&rrq(&["f", "netascii"])),
            Ok(Packet::Rrq(Request {
                mode: Mode::Netascii,
                ..
            }))
        ));
        let e = parse(&rrq(&["f", "mail"])).unwrap_err();
        assert_eq!(e.reply_code(), Some(ErrorCode::IllegalOperation));
    }

    #[test]
    fn truncated_and_garbage_never_panic() {
        for len in 0..12 {
            let full = rrq(&["a", "octet", "blksize"]);
            let _ = parse(&full[..len.min(full.len())]);
        }
        assert_eq!(parse(&[0]), Err(ParseError::Truncated));
        assert_eq!(parse(&[0, 4, 1]), Err(ParseError::Truncated));
        assert_eq!(parse(&[0, 1, b'a']), Err(ParseError::BadString));
        assert_eq!(parse(&[0, 9, 0, 0]), Err(ParseError::UnknownOpcode(9)));
        assert_eq!(parse(&[0, 1, 0xff, 0, b'o', 0]), Err(ParseError::BadString));
        // every 3-byte prefix of every opcode
        for op in 0..=8u8 {
            for a in [0u8, 1, 0xff] {
                let _ = parse(&[0, op, a]);
            }
        }
    }

    #[test]
    fn ack_error_and_encoders() {
        assert_eq!(
            parse(&[0, 4, 0x12, 0x34]),
            Ok(Packet::Ack { block: 0x1234 })
        );
        assert_eq!(
            parse(&error(ErrorCode::OptionRefused, "no")),
            Ok(Packet::Error {
                code: 8,
                message: "no".into()
            })
        );
        assert_eq!(
            parse(&[0, 5, 0, 8, b'x']),
            Ok(Packet::Error {
                code: 8,
                message: "x".into()
            })
        );
        assert_eq!(
            oack(&[("blksize", "1428".into())]),
            b"\0\x06blksize\x001428\0".to_vec()
        );
        assert_eq!(data_header(0x0102), [0, 3, 1, 2]);
    }

    #[test]
    fn trailing_padding_and_unpaired_option_ignored() {
        let mut v = rrq(&["f", "octet", "tsize", "0"]);
        v.extend_from_slice(&[0, 0, 0]);
        let Packet::Rrq(r) = parse(&v).unwrap() else {
            panic!()
        };
        assert_eq!(r.options.len(), 1);
        let Packet::Rrq(r) = parse(&rrq(&["f", "octet", "blksize"])).unwrap() else {
            panic!()
        };
        assert!(r.options.is_empty());
    }
}
