//! Fuzz strategic merge patch (`model::smp`): what the API applies for `PATCH` with
//! `application/strategic-merge-patch+json` on core Secrets and Events (kubectl's
//! default for built-in kinds). Checks: applying is deterministic (the same patch on the
//! same document gives the same result or the same error); a patch without directives
//! (`$` keys) and without the merged lists is exactly an RFC 7386 merge patch
//! (`store::merge_patch`); a successful patch is idempotent when it holds no list
//! directives (applying it again changes nothing).
//!
//! Input: a JSON document, then `\n`, then the patch (JSON).
#![no_main]

use bootplane::model::smp::apply;
use bootplane::store::merge_patch;
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
    let mut a = doc.clone();
    let ra = apply(&mut a, &patch);
    let mut b = doc.clone();
    assert_eq!(ra, apply(&mut b, &patch));
    if ra.is_err() {
        return;
    }
    assert_eq!(a, b);
    let plain = patch.to_string();
    if !plain.contains('$') && !plain.contains("finalizers") && !plain.contains("ownerReferences") {
        let mut m = doc.clone();
        merge_patch(&mut m, &patch);
        // smp makes a non-object target an object first, as merge patch does.
        assert_eq!(a, m, "a plain strategic patch is a merge patch");
    }
    if !plain.contains("$deleteFromPrimitiveList") && !plain.contains("ownerReferences") {
        let mut again = a.clone();
        apply(&mut again, &patch).unwrap();
        assert_eq!(again, a, "not idempotent");
    }
});
