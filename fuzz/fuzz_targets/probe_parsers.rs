//! Fuzz the discovery agent's parsers of firmware and wire input: the SMBIOS table
//! (`smbios::parse`, with and without an entry point, both UUID byte orders), the entry
//! point, and an LLDP frame (`lldp::parse_frame`, `lldp::parse_lldpdu`). Any panic is a
//! bug; the caps the parsers document must hold on every input.
//!
//! `scripts/fuzz.sh` runs it; seeds in `fuzz/seeds/probe_parsers/` (a QEMU-like SMBIOS
//! table and LLDP frames).
#![no_main]

use bootplane_probe::{lldp, smbios};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = smbios::entry_point_version(data);
    for version in [None, Some((2, 5)), Some((3, 0))] {
        let s = smbios::parse(data, version);
        assert!(s.memory_devices.len() <= smbios::MAX_STRUCTURES);
        assert!(s.processors.len() <= smbios::MAX_STRUCTURES);
        if let Some(u) = &s.uuid {
            assert_eq!(u.len(), 36, "{u}");
            assert_eq!(u, &u.to_ascii_lowercase());
        }
        for t in [&s.manufacturer, &s.product, &s.serial, &s.sku, &s.bios_version].into_iter().flatten() {
            assert!(!t.is_empty() && t.chars().count() <= smbios::MAX_STRING);
        }
    }
    let _ = lldp::parse_lldpdu(data);
    if let Some(n) = lldp::parse_frame(data) {
        assert!(data.len() <= lldp::MAX_FRAME);
        assert!(n.chassis_id.is_some() || n.mac_address.is_none());
    }
});
