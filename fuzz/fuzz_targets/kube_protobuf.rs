//! Fuzz kube's protobuf bodies (`api::kubepb`): the envelope and the v1 Secret that
//! `kubectl create secret` sends. Checks: decoding is deterministic, never panics, and
//! what it accepts is a JSON object of `apiVersion: v1`, `kind: Secret` with a
//! `metadata` map, which encodes back to JSON.
#![no_main]

use bootplane::api::kubepb::decode_object;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let r = decode_object(data);
    assert_eq!(r, decode_object(data));
    if let Ok(v) = r {
        assert_eq!((v["apiVersion"].as_str(), v["kind"].as_str()), (Some("v1"), Some("Secret")));
        assert!(v["metadata"].is_object());
        serde_json::to_vec(&v).unwrap();
    }
});
