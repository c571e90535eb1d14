//! Kubernetes-style objects for the API tests: resource paths and builders for the
//! Server and ServerClaim bodies the tests POST, and status accessors.

use serde_json::{json, Value};

pub const SERVERS: &str = "/apis/metal.ironcore.dev/v1alpha1/servers";

pub fn claims(ns: &str) -> String {
    format!("/apis/metal.ironcore.dev/v1alpha1/namespaces/{ns}/serverclaims")
}

pub fn sbcs(ns: &str) -> String {
    format!("/apis/metal.ironcore.dev/v1alpha1/namespaces/{ns}/serverbootconfigurations")
}

/// A registered, claimable server (inventory given through the API).
pub fn server(name: &str, labels: Value, policy: &str) -> Value {
    serde_json::json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": name, "labels": labels},
        "spec": {"systemUUID": format!("00000000-0000-0000-0000-{:012x}", fxhash(name) & 0xffff_ffff_ffff), "reclaimPolicy": policy},
        "status": {"state": "Available", "powerState": "Off",
                   "networkInterfaces": [{"name": "eth0", "macAddress": format!("52:54:00:{:02x}:{:02x}:{:02x}", fxhash(name) as u8, (fxhash(name) >> 8) as u8, (fxhash(name) >> 16) as u8), "ip": "10.0.0.1"}]},
    })
}

/// A claimable server like [`server`] (no labels, reclaim policy Recycle) whose one NIC
/// has MAC `mac` and address `ip`: a machine that fetches from that (loopback) address.
pub fn server_at(name: &str, mac: &str, ip: &str) -> Value {
    let mut s = server(name, serde_json::json!({}), "Recycle");
    s["status"]["networkInterfaces"] =
        serde_json::json!([{"name": "eth0", "macAddress": mac, "ip": ip}]);
    s
}

/// The condition of type `ty` in `obj`'s status; panics (showing `obj`) when there is none.
pub fn condition(obj: &Value, ty: &str) -> Value {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|l| l.iter().find(|c| c["type"] == ty))
        .cloned()
        .unwrap_or_else(|| panic!("no {ty} condition in {obj:#}"))
}

/// Whether `obj` has a condition of type `ty` with status True.
pub fn condition_true(obj: &Value, ty: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

pub fn claim(name: &str, selector: Option<Value>, server_ref: Option<&str>) -> Value {
    let mut spec = serde_json::json!({"image": "os-image:latest", "power": "On"});
    if let Some(s) = selector {
        spec["serverSelector"] = s;
    }
    if let Some(r) = server_ref {
        spec["serverRef"] = serde_json::json!({"name": r});
    }
    serde_json::json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1",
        "kind": "ServerClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
}

pub fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

pub const BMCS: &str = "/apis/metal.ironcore.dev/v1alpha1/bmcs";
pub const BMCSECRETS: &str = "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets";

/// A BMCSecret (user `admin`, `password`) and a BMC `name` for a Redfish service at
/// `base_url` (`http://127.0.0.1:PORT`, e.g. a fake BMC's): `(secret, bmc)`.
pub fn bmc_objects(name: &str, base_url: &str, password: &str) -> (Value, Value) {
    let port: u16 = base_url.rsplit(':').next().unwrap().parse().unwrap();
    let secret = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMCSecret",
        "metadata": {"name": name},
        "stringData": {"username": "admin", "password": password},
    });
    let bmc = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
        "metadata": {"name": name},
        "spec": {"access": {"ip": "127.0.0.1"}, "bmcSecretRef": {"name": name},
                 "protocol": {"name": "RedfishLocal", "port": port}},
    });
    (secret, bmc)
}

/// Apply [`bmc_objects`] through `b`'s API.
pub fn add_bmc(b: &super::bootplane::Bootplane, name: &str, base_url: &str, password: &str) {
    let (secret, bmc) = bmc_objects(name, base_url, password);
    let (c, v) = b.call("POST", BMCSECRETS, Some(&secret));
    assert_eq!(c, 201, "{v}");
    let (c, v) = b.call("POST", BMCS, Some(&bmc));
    assert_eq!(c, 201, "{v}");
}
