//! Machine identifiers as iPXE sends them: SMBIOS UUID (any case, hyphenated or not)
//! and MAC (`aa-bb-cc-dd-ee-ff` from `${net0/mac:hexhyp}`, or colon separated from
//! `${mac}`). Parsing is strict: anything else is a malformed request (400), never a
//! lookup with garbage.

use std::fmt;
use std::net::IpAddr;

/// A key into the [`super::BootIndex`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MachineId {
    /// Lowercase hyphenated UUID.
    Uuid(String),
    Mac([u8; 6]),
    Ip(IpAddr),
    /// The Server's name (Ignition URLs and signed script URLs carry it).
    Server(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("malformed uuid {0:?}")]
    Uuid(String),
    #[error("malformed mac {0:?}")]
    Mac(String),
}

/// Parse a UUID in any case, with or without hyphens/braces, to lowercase hyphenated.
pub fn parse_uuid(s: &str) -> Result<String, IdError> {
    let short: String = s.chars().take(64).collect();
    uuid::Uuid::try_parse(s)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| IdError::Uuid(short))
}

/// Parse `aa-bb-cc-dd-ee-ff`, `aa:bb:cc:dd:ee:ff` or `aabbccddeeff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], IdError> {
    let err = || IdError::Mac(s.chars().take(64).collect());
    let hex: String = if s.len() == 17 {
        let sep = s.as_bytes()[2];
        if sep != b'-' && sep != b':' {
            return Err(err());
        }
        let mut out = String::with_capacity(12);
        for (i, part) in s.split(sep as char).enumerate() {
            if i > 5 || part.len() != 2 {
                return Err(err());
            }
            out.push_str(part);
        }
        out
    } else if s.len() == 12 {
        s.to_string()
    } else {
        return Err(err());
    };
    let mut mac = [0u8; 6];
    hex::decode_to_slice(hex.as_bytes(), &mut mac).map_err(|_| err())?;
    Ok(mac)
}

/// Format as `aa:bb:cc:dd:ee:ff`.
pub struct MacFmt<'a>(pub &'a [u8; 6]);

impl fmt::Display for MacFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_any_case() {
        let want = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
        assert_eq!(
            parse_uuid("4C4C4544-0042-3510-8052-B4C04F4E4D32").unwrap(),
            want
        );
        assert_eq!(
            parse_uuid("4c4c4544004235108052b4c04f4e4d32").unwrap(),
            want
        );
        assert!(parse_uuid("1234").is_err());
        assert!(parse_uuid("4c4c4544-0042-3510-8052-b4c04f4e4dzz").is_err());
        assert!(parse_uuid("").is_err());
    }

    #[test]
    fn mac_forms() {
        let want = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
        assert_eq!(parse_mac("52-54-00-ab-cd-ef").unwrap(), want);
        assert_eq!(parse_mac("52:54:00:AB:CD:EF").unwrap(), want);
        assert_eq!(parse_mac("525400abcdef").unwrap(), want);
        for bad in [
            "52-54-00-ab-cd",
            "52-54-00-ab-cd-eg",
            "52-54:00-ab-cd-ef",
            "5254-00-ab-cd-ef-",
            "",
            "zz",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        assert_eq!(MacFmt(&want).to_string(), "52:54:00:ab:cd:ef");
    }
}
