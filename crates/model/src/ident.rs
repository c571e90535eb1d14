//! Machine identities, with the one grammar every reader uses: the HTTP boot listener
//! (what iPXE sends), the DHCP settings and lease file, Server objects
//! (`status.networkInterfaces[].macAddress`, `spec.systemUUID`) and the power driver.
//!
//! - MAC: `aa-bb-cc-dd-ee-ff` (iPXE's `${net0/mac:hexhyp}`), `aa:bb:cc:dd:ee:ff`
//!   (`${mac}`, the config file) or `aabbccddeeff`; two hex digits per octet, any case,
//!   one separator throughout. Formatted as `aa:bb:cc:dd:ee:ff` ([`MacFmt`]).
//! - UUID (SMBIOS): any case, hyphenated or not (or braced/`urn:uuid:`), normalised
//!   to lowercase hyphenated.
//!
//! Parsing is strict: anything else is an error (a 400 at the boot listener, a config
//! error, an interface or UUID ignored), never a lookup with garbage.

use std::fmt;

/// A MAC address (Ethernet, 6 bytes).
pub type Mac = [u8; 6];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("malformed uuid {0:?}")]
    Uuid(String),
    #[error("malformed mac {0:?}")]
    Mac(String),
}

/// Parse a UUID in any case, with or without hyphens/braces, to lowercase hyphenated.
pub fn parse_uuid(s: &str) -> Result<String, IdError> {
    // Every script request parses one: the error's copy of the input is made only for an
    // error, and the text is written into a stack buffer, not through core::fmt.
    match uuid::Uuid::try_parse(s) {
        Ok(u) => Ok(u
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .to_owned()),
        Err(_) => Err(IdError::Uuid(s.chars().take(64).collect())),
    }
}

/// Parse `aa-bb-cc-dd-ee-ff`, `aa:bb:cc:dd:ee:ff` or `aabbccddeeff`.
pub fn parse_mac(s: &str) -> Result<Mac, IdError> {
    let err = || IdError::Mac(s.chars().take(64).collect());
    // Every script and Ignition request parses one: no allocation on the way.
    let b = s.as_bytes();
    let octets: [&[u8]; 6] = match b.len() {
        17 => {
            let sep = b[2];
            if (sep != b'-' && sep != b':') || (1..6).any(|i| b[i * 3 - 1] != sep) {
                return Err(err());
            }
            std::array::from_fn(|i| &b[i * 3..i * 3 + 2])
        }
        12 => std::array::from_fn(|i| &b[i * 2..i * 2 + 2]),
        _ => return Err(err()),
    };
    let mut mac = [0u8; 6];
    for (byte, hex) in mac.iter_mut().zip(octets) {
        hex::decode_to_slice(hex, std::slice::from_mut(byte)).map_err(|_| err())?;
    }
    Ok(mac)
}

/// Format as `aa:bb:cc:dd:ee:ff`.
pub struct MacFmt<'a>(pub &'a Mac);

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

    /// The DHCP settings used to have a laxer grammar of their own (any mix of `:`
    /// and `-`, one or two digits per octet, a leading `+`); no config, test or lease
    /// file used it, and the boot side never accepted it.
    #[test]
    fn no_lax_forms() {
        for bad in [
            "52:54:0:ab:cd:ef",
            "2:0:0:0:0:1",
            "52:54-00:ab-cd:ef",
            "+2:54:00:ab:cd:ef",
            "52:54:00:ab:cd:ef ",
            " 525400abcdef",
            "52:54:00:ab:cd:ef:01",
            "525400abcdef01",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        // What the DHCP settings and the lease file accepted and wrote stays valid.
        let m = parse_mac("52:54:00:12:34:56").unwrap();
        assert_eq!(parse_mac(&MacFmt(&m).to_string()).unwrap(), m);
    }
}
