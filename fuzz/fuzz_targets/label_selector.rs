//! Fuzz the label selector string syntax (`labelSelector=`, `-l`): `Selector::parse`,
//! then `matches` against a label set taken from the input. Checks: parsing is
//! deterministic, the empty selector matches everything, and a selector's parts each
//! parse on their own when the whole parses (conjunction: the whole matches iff every
//! part does).
//!
//! Input: the selector, then optionally `\n` and `key=value` label lines.
#![no_main]

use bootplane::model::selector::Selector;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (sel, labels) = text.split_once('\n').unwrap_or((text, ""));
    let mut map = Map::new();
    for l in labels.lines().take(64) {
        let (k, v) = l.split_once('=').unwrap_or((l, ""));
        map.insert(k.to_string(), Value::String(v.to_string()));
    }
    let Ok(s) = Selector::parse(sel) else { return };
    assert_eq!(Selector::parse(sel), Ok(s.clone()));
    let m = s.matches(Some(&map));
    if s.is_empty() {
        assert!(m && s.matches(None));
    }
    // Split at top-level commas (outside parentheses) like the parser; each part is a
    // selector of its own.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&sel[start..]);
    let mut all = true;
    for p in parts {
        let ps = Selector::parse(p).expect("a part of a valid selector parses");
        all &= ps.matches(Some(&map));
    }
    assert_eq!(all, m, "conjunction of the parts");
});
