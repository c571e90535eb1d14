//! Fuzz the discovery agent's inventory as the boot listener reads it: the JSON shape
//! (`bootplane_probe::Inventory`, unknown fields refused) and `http::discovery::check`
//! (bounds and formats), then the writer's mapping onto a Server's status
//! (`controller::inventory::apply`). Checks: a checked inventory always maps without
//! panicking, its quantities parse back to the bytes reported, and what passes `check`
//! stays within the route's bounds.
//!
//! Input: a request body.
#![no_main]

use std::collections::BTreeMap;

use bootplane::controller::inventory::{apply, quantity};
use bootplane::http::discovery::check;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(inv) = serde_json::from_slice::<bootplane_probe::Inventory>(data) else {
        return;
    };
    if check(&inv).is_err() {
        return;
    }
    assert!(inv.nics.len() <= 64 && inv.disks.len() <= 256 && inv.cpus.len() <= 1024);
    let mut st = serde_json::json!({});
    let mut ann = BTreeMap::new();
    apply(&mut st, &mut ann, &inv, &|_| false);
    // A MAC reported twice is one interface.
    assert!(st["networkInterfaces"].as_array().map_or(0, Vec::len) <= inv.nics.len());
    let q = quantity(inv.memory_bytes);
    let back = match q.find(|c: char| !c.is_ascii_digit()) {
        None => q.parse::<u64>().unwrap(),
        Some(i) => {
            let n: u64 = q[..i].parse().unwrap();
            let shift = match &q[i..] {
                "Ki" => 10,
                "Mi" => 20,
                "Gi" => 30,
                "Ti" => 40,
                "Pi" => 50,
                s => panic!("suffix {s}"),
            };
            n << shift
        }
    };
    assert_eq!(back, inv.memory_bytes);
});
