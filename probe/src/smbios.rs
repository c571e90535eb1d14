//! SMBIOS (DMI) table parser: the system, BIOS, processor and memory facts the firmware
//! describes, read from `/sys/firmware/dmi/tables/{smbios_entry_point,DMI}`.
//!
//! Pure and bounded: the table is cut at [`MAX_TABLE`] bytes, at most [`MAX_STRUCTURES`]
//! structures are walked, strings are capped at [`MAX_STRING`] bytes, and garbage ends the
//! walk (what was parsed before it is kept); nothing here panics on any input.

/// Largest table read (SMBIOS 3.x allows 4 GiB; real ones are a few KiB).
pub const MAX_TABLE: usize = 1 << 20;
/// Most structures walked.
pub const MAX_STRUCTURES: usize = 4096;
/// Longest string kept (longer ones are cut).
pub const MAX_STRING: usize = 256;

/// The entry point's version (major, minor); `None` when there is no valid entry point.
pub fn entry_point_version(ep: &[u8]) -> Option<(u8, u8)> {
    if ep.len() >= 0x18 && &ep[..5] == b"_SM3_" {
        return Some((ep[7], ep[8]));
    }
    if ep.len() >= 0x1f && &ep[..4] == b"_SM_" {
        return Some((ep[6], ep[7]));
    }
    None
}

/// One processor socket (type 4), populated ones only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processor {
    pub socket: String,
    pub manufacturer: Option<String>,
    pub version: Option<String>,
    pub max_speed_mhz: Option<u32>,
    pub cores: u32,
    pub threads: u32,
}

/// What the table says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Smbios {
    pub bios_version: Option<String>,
    pub manufacturer: Option<String>,
    pub product: Option<String>,
    pub serial: Option<String>,
    pub sku: Option<String>,
    /// Lowercase canonical, `None` when absent (all 0x00) or unset (all 0xFF).
    pub uuid: Option<String>,
    pub processors: Vec<Processor>,
    /// Sizes of the installed memory devices (type 17), bytes; empty slots skipped.
    pub memory_devices: Vec<u64>,
    /// Whether the walk stopped early (truncated or malformed table).
    pub truncated: bool,
}

impl Smbios {
    /// Installed memory: the sum of the memory devices.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_devices
            .iter()
            .fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// One structure: its formatted area and its strings.
struct Structure<'a> {
    kind: u8,
    data: &'a [u8],
    strings: Vec<&'a [u8]>,
}

impl Structure<'_> {
    fn byte(&self, off: usize) -> Option<u8> {
        self.data.get(off).copied()
    }
    fn word(&self, off: usize) -> Option<u16> {
        Some(u16::from_le_bytes([
            *self.data.get(off)?,
            *self.data.get(off + 1)?,
        ]))
    }
    fn dword(&self, off: usize) -> Option<u32> {
        let b = self.data.get(off..off + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// The string a byte at `off` points at (1-based; 0 = none), trimmed, empty → None.
    fn string(&self, off: usize) -> Option<String> {
        let idx = self.byte(off)? as usize;
        let raw = self.strings.get(idx.checked_sub(1)?)?;
        clean(raw)
    }
}

/// Printable text from firmware bytes, trimmed and capped; empty → None.
pub fn clean(raw: &[u8]) -> Option<String> {
    let raw = &raw[..raw.len().min(MAX_STRING)];
    let s: String = String::from_utf8_lossy(raw)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Split the table into structures, stopping at type 127, the caps, or garbage.
fn structures(table: &[u8]) -> (Vec<Structure<'_>>, bool) {
    let table = &table[..table.len().min(MAX_TABLE)];
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < table.len() {
        if out.len() >= MAX_STRUCTURES {
            return (out, true);
        }
        let Some(&[kind, len]) = table.get(pos..pos + 2) else {
            return (out, true);
        };
        let len = len as usize;
        if len < 4 || pos + len > table.len() {
            return (out, true);
        }
        let data = &table[pos..pos + len];
        // Strings: NUL-terminated, the set ends with an empty one (a double NUL).
        let mut strings = Vec::new();
        let mut p = pos + len;
        let end = loop {
            let Some(rel) = table[p.min(table.len())..].iter().position(|&b| b == 0) else {
                return (out, true);
            };
            if rel == 0 {
                // First string empty: the area is just the double NUL.
                break if strings.is_empty() { p + 2 } else { p + 1 };
            }
            strings.push(&table[p..p + rel]);
            p += rel + 1;
        };
        if end > table.len() {
            return (out, true);
        }
        out.push(Structure {
            kind,
            data,
            strings,
        });
        if kind == 127 {
            return (out, false);
        }
        pos = end;
    }
    (out, false)
}

/// Parse a table; `version` from the entry point decides the UUID byte order (SMBIOS ≥ 2.6
/// stores the first three fields little-endian; no entry point is read as ≥ 2.6).
pub fn parse(table: &[u8], version: Option<(u8, u8)>) -> Smbios {
    let (structs, truncated) = structures(table);
    let mut out = Smbios {
        truncated,
        ..Smbios::default()
    };
    let le_uuid = version.is_none_or(|v| v >= (2, 6));
    for s in &structs {
        match s.kind {
            0 => out.bios_version = out.bios_version.take().or_else(|| s.string(0x05)),
            1 => system(s, le_uuid, &mut out),
            4 => {
                if let Some(p) = processor(s) {
                    out.processors.push(p);
                }
            }
            17 => {
                if let Some(size) = memory_device(s) {
                    out.memory_devices.push(size);
                }
            }
            _ => {}
        }
    }
    out
}

fn system(s: &Structure<'_>, le_uuid: bool, out: &mut Smbios) {
    out.manufacturer = s.string(0x04);
    out.product = s.string(0x05);
    out.serial = s.string(0x07);
    out.sku = s.string(0x19);
    out.uuid = s.data.get(0x08..0x18).and_then(|b| uuid(b, le_uuid));
}

/// Canonical lowercase UUID text of 16 SMBIOS bytes.
pub fn uuid(b: &[u8], le: bool) -> Option<String> {
    if b.len() != 16 || b.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 0xff) {
        return None;
    }
    let mut u = [0u8; 16];
    u.copy_from_slice(b);
    if le {
        u[0..4].reverse();
        u[4..6].reverse();
        u[6..8].reverse();
    }
    let h: Vec<String> = u.iter().map(|x| format!("{x:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    ))
}

fn processor(s: &Structure<'_>) -> Option<Processor> {
    // Status bit 6: socket populated (absent status byte: assume populated).
    if s.byte(0x18).is_some_and(|st| st & 0x40 == 0) {
        return None;
    }
    let count = |short: usize, long: usize| -> u32 {
        match s.byte(short) {
            Some(0xff) => s.word(long).map(u32::from).unwrap_or(0xff),
            Some(n) => n as u32,
            None => 0,
        }
    };
    Some(Processor {
        socket: s.string(0x04).unwrap_or_default(),
        manufacturer: s.string(0x07),
        version: s.string(0x10),
        max_speed_mhz: s.word(0x14).filter(|&m| m != 0).map(u32::from),
        cores: count(0x23, 0x2a),
        threads: count(0x25, 0x2e),
    })
}

/// A memory device's size in bytes; `None` for an empty slot or unknown size.
fn memory_device(s: &Structure<'_>) -> Option<u64> {
    const MIB: u64 = 1 << 20;
    match s.word(0x0c)? {
        0 | 0xffff => None,
        0x7fff => {
            let ext = s.dword(0x1c)? & 0x7fff_ffff;
            (ext != 0).then(|| ext as u64 * MIB)
        }
        v if v & 0x8000 != 0 => Some((v & 0x7fff) as u64 * 1024),
        v => Some(v as u64 * MIB),
    }
}

#[cfg(test)]
#[path = "smbios_tests.rs"]
pub(crate) mod tests;
