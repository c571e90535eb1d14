//! Fuzz the label selector string syntax (`labelSelector=`, `-l`): `Selector::parse`,
//! then `matches` against a label set taken from the input. Checks: parsing is
//! deterministic, the empty selector matches everything, and a selector's parts each
//! parse on their own when the whole parses (conjunction: the whole matches iff every
//! part does). The same input is also a field selector (`fieldSelector=`,
//! `FieldSelector::parse`), matched against an object holding the labels as fields:
//! deterministic, the empty one matches everything, and a term and its negation never
//! both match.
//!
//! Input: the selector, then optionally `\n` and `key=value` label lines.
#![no_main]

use bootplane_model::selector::{split_top, FieldSelector, Selector};
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
    field_selector(sel, &map);
    let Ok(s) = Selector::parse(sel) else { return };
    assert_eq!(Selector::parse(sel), Ok(s.clone()));
    let m = s.matches(Some(&map));
    if s.is_empty() {
        assert!(m && s.matches(None));
    }
    // Split at top-level commas (outside parentheses) as the parser does; each part is
    // a selector of its own.
    let parts = split_top(sel);
    let mut all = true;
    for p in parts {
        let ps = Selector::parse(p).expect("a part of a valid selector parses");
        all &= ps.matches(Some(&map));
    }
    assert_eq!(all, m, "conjunction of the parts");
});

fn field_selector(sel: &str, fields: &Map<String, Value>) {
    let Ok(f) = FieldSelector::parse(sel) else { return };
    assert_eq!(FieldSelector::parse(sel), Ok(f.clone()));
    let obj = Value::Object(fields.clone());
    let m = f.matches(&obj);
    if f.is_empty() {
        assert!(m);
    }
    // One term: `a=b` and `a!=b` never both match.
    if !sel.contains(',') {
        if let Some((k, v)) = sel.split_once("!=") {
            if let Ok(pos) = FieldSelector::parse(&format!("{k}=={v}")) {
                assert!(!(m && pos.matches(&obj)), "{sel:?}");
            }
        }
    }
}
