//! Fuzz Butane → Ignition translation (`butane::translate_with`, what templates and
//! Ignition secrets go through), with a few local files for `local:` references.
//! Checks: a translated config passes Ignition validation for the version it claims
//! (`validate::validate`, the same check the boot side applies before serving), and
//! serializes to JSON that parses back to the same value. Any panic is a bug.
#![no_main]

use bootplane::ignition::{butane, validate, FilesDir};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static FILES: FilesDir = {
        let mut f = FilesDir::new();
        f.file("a.txt", b"hello\n".to_vec(), false)
            .file("bin/run.sh", b"#!/bin/sh\necho hi\n".to_vec(), true)
            .file("big", vec![b'x'; 8192], false)
            .symlink("link", "a.txt")
            .dir("tree/empty")
            .file("tree/f", b"f".to_vec(), false)
            .file("key.pub", b"ssh-ed25519 AAAA test".to_vec(), false)
            .file("merge.ign", br#"{"ignition":{"version":"3.4.0"}}"#.to_vec(), false);
        f
    };
}

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(t) = FILES.with(|f| butane::translate_with(src, f)) else {
        return;
    };
    match validate::validate(&t.config) {
        Ok(v) => assert_eq!(v, t.version),
        Err(e) => panic!("translated config does not validate: {e}"),
    }
    let text = serde_json::to_string(&t.config).expect("serialize");
    let back: serde_json::Value = serde_json::from_str(&text).expect("reparse");
    assert_eq!(back, t.config);
});
