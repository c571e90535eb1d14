//! Fuzz JSON patch (RFC 6902, `model::jsonpatch`): what the API applies for `PATCH` with
//! `application/json-patch+json` and the CLI for `patch --type json`. Checks: checking a
//! patch is deterministic; applying one is all or nothing (on an error the document is
//! unchanged) and deterministic (the same patch on the same document gives the same
//! result); a patch of `test` operations alone never changes the document.
//!
//! Input: a JSON document, then `\n`, then the patch (JSON).
#![no_main]

use bootplane_model::jsonpatch::{apply, check_ops};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Some((doc, patch)) = text.split_once('\n') else { return };
    let (Ok(doc), Ok(patch)) = (
        serde_json::from_str::<Value>(doc),
        serde_json::from_str::<Value>(patch),
    ) else {
        return;
    };
    let checked = check_ops(&patch);
    assert_eq!(checked, check_ops(&patch));
    let Ok(ops) = checked else { return };
    let mut a = doc.clone();
    let ra = apply(&mut a, &ops);
    if ra.is_err() {
        assert_eq!(a, doc, "a failing patch changed the document");
    }
    let mut b = doc.clone();
    assert_eq!(ra, apply(&mut b, &ops));
    assert_eq!(a, b);
    if ops.iter().all(|o| o["op"] == "test") {
        assert_eq!(a, doc);
    }
});
