//! Fuzz what the Redfish client makes of a BMC's answers: `redfish::parse` (collections,
//! service root, ComputerSystem, Manager, VirtualMedia, task monitors) on any JSON, and
//! `error_message` on any bytes. Checks: the object keeps the path it was read from when
//! the body has no (or an empty) `@odata.id`; a power state is read only when it is one Redfish names;
//! an error message is bounded; a collection's members are exactly its `@odata.id`s.
//!
//! Input: a response body.
#![no_main]

use bootplane::redfish::parse;
use bootplane::redfish::PowerState;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let msg = parse::error_message(data);
    assert!(msg.len() <= 200 + '…'.len_utf8(), "unbounded error message");
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    let path = "/redfish/v1/Systems/fuzz";
    let s = parse::system(&v, path, None);
    match v.get("@odata.id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => assert_eq!(s.odata_id, id),
        _ => assert_eq!(s.odata_id, path),
    }
    let p = v.get("PowerState").and_then(Value::as_str);
    assert_eq!(s.power_state, p.and_then(PowerState::parse));
    if let Ok(m) = parse::members(&v) {
        let n = v["Members"].as_array().map_or(0, Vec::len);
        assert_eq!(m.len(), n);
    }
    let _ = parse::service_root(&v);
    let _ = parse::sessions_link(&v);
    let _ = parse::manager(&v, "/redfish/v1/Managers/fuzz");
    let vm = parse::virtual_media(&v, "/redfish/v1/Managers/fuzz/VirtualMedia/Cd", None);
    assert!(!vm.odata_id.is_empty());
    let _ = parse::task(&v);
});
