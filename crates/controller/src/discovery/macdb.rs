//! The MAC-prefix database: which BMCs a management-network lease belongs to, by the
//! first octets of its MAC, and how to talk to them (protocol, port, the BMCSecret with
//! the vendor's default credentials). Pure parse + lookup; the file is bounded in size
//! and entries, and every bad or duplicate entry is refused with its index and prefix.
//!
//! ```yaml
//! macPrefixes:
//! - macPrefix: "52:54:00:b0"       # 1..6 octets, aa:bb:cc or aabbcc
//!   manufacturer: Contoso
//!   protocol: RedfishLocal          # Redfish (https) | RedfishLocal (http)
//!   port: 8000
//!   defaultCredentialsSecret: contoso-default   # a BMCSecret (no passwords here)
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::ident::Mac;

/// Largest database file read.
pub(crate) const MAX_BYTES: usize = 1 << 20;
/// Most entries in the database.
pub(crate) const MAX_ENTRIES: usize = 10_000;

/// Why the database was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum MacDbError {
    #[error("mac database is {0} bytes (at most {MAX_BYTES})")]
    TooLarge(usize),
    #[error("mac database has {0} entries (at most {MAX_ENTRIES})")]
    TooMany(usize),
    #[error("mac database: {0}")]
    Syntax(String),
    #[error("mac database entry {index} ({prefix:?}): {why}")]
    Entry {
        index: usize,
        prefix: String,
        why: String,
    },
}

/// The protocols a discovered BMC can be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum Protocol {
    Redfish,
    RedfishLocal,
}

impl Protocol {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Protocol::Redfish => "Redfish",
            Protocol::RedfishLocal => "RedfishLocal",
        }
    }
}

/// One vendor's BMCs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The prefix as octets (1..=6).
    pub prefix: Vec<u8>,
    pub manufacturer: String,
    pub protocol: Protocol,
    pub port: u16,
    /// The BMCSecret holding the vendor's default username and password.
    pub default_credentials_secret: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEntry {
    mac_prefix: String,
    #[serde(default)]
    manufacturer: String,
    protocol: Protocol,
    port: u16,
    default_credentials_secret: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDb {
    #[serde(default)]
    mac_prefixes: Vec<serde_norway::Value>,
}

/// The database: longest matching prefix wins.
#[derive(Debug, Clone, Default)]
pub struct MacDb {
    /// Prefix octets → entry.
    entries: BTreeMap<Vec<u8>, Entry>,
}

/// `aa:bb:cc`, `aa-bb-cc` or `aabbcc` → octets (1..=6).
pub(crate) fn parse_prefix(s: &str) -> Result<Vec<u8>, String> {
    let hex: String = s.chars().filter(|c| !matches!(c, ':' | '-')).collect();
    let separated = hex.len() != s.len();
    if separated && s.split([':', '-']).any(|p| p.len() != 2) {
        return Err("octets must be two hex digits each".into());
    }
    if hex.is_empty() || !hex.len().is_multiple_of(2) || hex.len() > 12 {
        return Err("must be 1 to 6 octets (aa:bb:cc or aabbcc)".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| "not hexadecimal".into()))
        .collect()
}

impl MacDb {
    /// Parses and checks the database text.
    pub(crate) fn parse(text: &str) -> Result<MacDb, MacDbError> {
        if text.len() > MAX_BYTES {
            return Err(MacDbError::TooLarge(text.len()));
        }
        let raw: RawDb =
            serde_norway::from_str(text).map_err(|e| MacDbError::Syntax(e.to_string()))?;
        if raw.mac_prefixes.len() > MAX_ENTRIES {
            return Err(MacDbError::TooMany(raw.mac_prefixes.len()));
        }
        let mut entries = BTreeMap::new();
        for (index, v) in raw.mac_prefixes.into_iter().enumerate() {
            let shown = v
                .get("macPrefix")
                .and_then(|p| p.as_str())
                .unwrap_or("")
                .to_string();
            let bad = |why: String| MacDbError::Entry {
                index,
                prefix: shown.clone(),
                why,
            };
            let e: RawEntry = serde_norway::from_value(v).map_err(|e| bad(e.to_string()))?;
            let prefix = parse_prefix(&e.mac_prefix).map_err(|w| bad(format!("macPrefix {w}")))?;
            if e.port == 0 {
                return Err(bad("port must be 1..65535".into()));
            }
            if !crate::model::meta::valid_object_name(&e.default_credentials_secret) {
                return Err(bad(
                    "defaultCredentialsSecret must be a BMCSecret name".into()
                ));
            }
            if entries.contains_key(&prefix) {
                return Err(bad("duplicate macPrefix".into()));
            }
            let entry = Entry {
                prefix: prefix.clone(),
                manufacturer: e.manufacturer,
                protocol: e.protocol,
                port: e.port,
                default_credentials_secret: e.default_credentials_secret,
            };
            entries.insert(prefix, entry);
        }
        Ok(MacDb { entries })
    }

    /// The entry with the longest prefix of `mac`.
    pub(crate) fn lookup(&self, mac: &Mac) -> Option<&Entry> {
        (1..=6).rev().find_map(|n| self.entries.get(&mac[..n]))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DB: &str = "macPrefixes:
- macPrefix: \"52:54:00\"
  manufacturer: Generic
  protocol: Redfish
  port: 443
  defaultCredentialsSecret: generic-default
- macPrefix: 525400b0
  manufacturer: Contoso
  protocol: RedfishLocal
  port: 8000
  defaultCredentialsSecret: contoso-default
";

    #[test]
    fn longest_prefix_wins_and_unknown_is_none() {
        let db = MacDb::parse(DB).unwrap();
        assert_eq!(db.len(), 2);
        let e = db.lookup(&[0x52, 0x54, 0, 0xb0, 0, 1]).unwrap();
        assert_eq!((e.manufacturer.as_str(), e.port), ("Contoso", 8000));
        assert_eq!(e.protocol, Protocol::RedfishLocal);
        let e = db.lookup(&[0x52, 0x54, 0, 0xb1, 0, 1]).unwrap();
        assert_eq!(e.default_credentials_secret, "generic-default");
        assert!(db.lookup(&[0x02, 0, 0, 0, 0, 1]).is_none());
        assert!(MacDb::parse("macPrefixes: []").unwrap().is_empty());
    }

    #[test]
    fn prefixes_in_both_spellings_and_bad_ones() {
        assert_eq!(parse_prefix("aa:BB:cc").unwrap(), vec![0xaa, 0xbb, 0xcc]);
        assert_eq!(parse_prefix("aabbcc").unwrap(), vec![0xaa, 0xbb, 0xcc]);
        assert_eq!(parse_prefix("01").unwrap(), vec![1]);
        assert_eq!(parse_prefix("010203040506").unwrap().len(), 6);
        for bad in ["", "a", "abc", "0102030405060708", "a:bb", "zz", "aa::bb"] {
            assert!(parse_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_entries_name_the_entry() {
        let dup = format!(
            "{DB}- macPrefix: \"52-54-00\"\n  protocol: Redfish\n  port: 1\n  defaultCredentialsSecret: x\n"
        );
        let e = MacDb::parse(&dup).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mac database entry 2 (\"52-54-00\"): duplicate macPrefix"
        );
        let cases = [
            ("macPrefix: zz\n  protocol: Redfish\n  port: 1\n  defaultCredentialsSecret: x", "macPrefix"),
            ("macPrefix: aa\n  protocol: IPMI\n  port: 1\n  defaultCredentialsSecret: x", "IPMI"),
            ("macPrefix: aa\n  protocol: Redfish\n  port: 0\n  defaultCredentialsSecret: x", "port"),
            ("macPrefix: aa\n  protocol: Redfish\n  port: 1\n  defaultCredentialsSecret: Bad_Name", "BMCSecret"),
            ("macPrefix: aa\n  protocol: Redfish\n  port: 1\n  password: x\n  defaultCredentialsSecret: x", "password"),
        ];
        for (entry, want) in cases {
            let e = MacDb::parse(&format!("macPrefixes:\n- {entry}\n")).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("mac database entry 0"), "{msg}");
            assert!(msg.contains(want), "{want}: {msg}");
        }
        assert!(matches!(
            MacDb::parse(&"#".repeat(MAX_BYTES + 1)),
            Err(MacDbError::TooLarge(_))
        ));
        let many: String = (0..=MAX_ENTRIES)
            .map(|i| format!("- {{macPrefix: \"{:06x}\", protocol: Redfish, port: 1, defaultCredentialsSecret: x}}\n", i))
            .collect();
        assert!(matches!(
            MacDb::parse(&format!("macPrefixes:\n{many}")),
            Err(MacDbError::TooMany(_))
        ));
        assert!(matches!(
            MacDb::parse("macPrefixes: 3"),
            Err(MacDbError::Syntax(_))
        ));
    }
}
