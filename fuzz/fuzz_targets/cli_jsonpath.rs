//! Fuzz the CLI's kubectl JSONPath templates (`get -o jsonpath=`, `-o custom-columns=`,
//! `--sort-by`): `cli::output::Template::parse`, then `render` and `select` against a
//! JSON document from the input, `Columns` and `sort_by` on the same expression.
//! Checks: parsing and rendering are deterministic; whatever the document holds (text a
//! machine, a BMC or another API client wrote), a template with no control character
//! and no backslash of its own renders none but line breaks and tabs; custom columns
//! render exactly one line per item plus the header, without any control character;
//! `--sort-by` keeps every item (a permutation).
//!
//! Input: the template, then optionally `\n` and a JSON document (default `{}`). At most
//! two `range`s: nested ranges cost the product of the arrays' lengths (the operator's
//! own template, as with kubectl), which would only make the fuzzer time out.
#![no_main]

use bootplane::cli::output::{sort_by, Columns, Template};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (tmpl, doc) = text.split_once('\n').unwrap_or((text, "{}"));
    if tmpl.matches("range").count() > 2 {
        return;
    }
    let Ok(doc) = serde_json::from_str::<Value>(doc) else { return };
    let Ok(t) = Template::parse(tmpl) else { return };
    assert_eq!(Template::parse(tmpl).ok(), Some(t.clone()), "parse is deterministic");
    let out = t.render(&doc);
    assert_eq!(out, t.render(&doc), "render is deterministic");
    let own_controls = tmpl.contains('\\') || tmpl.chars().any(char::is_control);
    if !own_controls {
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
            "a control character from the document reached the output: {tmpl:?} -> {out:?}"
        );
    }
    let _ = t.select(&doc);

    let mut items = match &doc {
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    if !tmpl.contains([',', ':']) && !tmpl.chars().any(char::is_control) {
        if let Ok(c) = Columns::parse(&format!("H:{tmpl}")) {
            let table = c.render(&items, false);
            assert_eq!(table.matches('\n').count(), items.len() + 1, "{table:?}");
            assert!(
                !table.chars().any(|c| c.is_control() && c != '\n'),
                "{table:?}"
            );
        }
    }
    let before = items.len();
    if sort_by(&mut items, tmpl).is_ok() {
        assert_eq!(items.len(), before);
        let orig = match &doc {
            Value::Array(a) => a.clone(),
            other => vec![other.clone()],
        };
        for it in &orig {
            let want = orig.iter().filter(|o| *o == it).count();
            let got = items.iter().filter(|o| *o == it).count();
            assert_eq!(want, got, "sort_by is a permutation");
        }
    }
});
