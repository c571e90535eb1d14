//! Fuzz Ignition validation (`validate::parse_json` + `validate::validate`: the embedded
//! JSON schemas and Ignition's semantic rules) as applied to rendered configs and to
//! Ignition given directly in a secret. Checks: `validate` agrees with `check` for the
//! version it reports; no panic.
#![no_main]

use bootplane::ignition::validate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(v) = validate::parse_json(src) else { return };
    match validate::validate(&v) {
        Ok(ver) => assert!(validate::check(&v, ver).is_empty()),
        Err(_) => {
            if let Ok(ver) = validate::version_of(&v) {
                assert!(!validate::check(&v, ver).is_empty());
            }
        }
    }
});
