//! Property tests of label selectors (`model::selector::Selector`): a selector written
//! from a model (equality, inequality, set membership, existence) parses, and matches
//! exactly the label sets the model says it matches. There is no printer in the crate,
//! so the string form is written here, as `kubectl -l` users write it.

use std::collections::BTreeMap;

use bootplane::model::selector::Selector;
use proptest::prelude::*;
use serde_json::{Map, Value};

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("app.kubernetes.io/name".to_string()),
        "[a-c]{1,2}"
    ]
}

fn val() -> impl Strategy<Value = String> {
    "[a-c0-9]{1,2}"
}

fn req() -> impl Strategy<Value = Req> {
    prop_oneof![
        (key(), val()).prop_map(|(k, v)| Req::Eq(k, v)),
        (key(), val()).prop_map(|(k, v)| Req::NotEq(k, v)),
        (key(), proptest::collection::vec(val(), 1..4)).prop_map(|(k, v)| Req::In(k, v)),
        (key(), proptest::collection::vec(val(), 1..4)).prop_map(|(k, v)| Req::NotIn(k, v)),
        key().prop_map(Req::Exists),
        key().prop_map(Req::NotExists),
    ]
}

fn print(r: &Req, spaced: bool) -> String {
    let sp = if spaced { " " } else { "" };
    match r {
        Req::Eq(k, v) => format!("{k}{sp}={sp}{v}"),
        Req::NotEq(k, v) => format!("{k}{sp}!={sp}{v}"),
        Req::In(k, v) => format!("{k} in ({})", v.join(&format!(",{sp}"))),
        Req::NotIn(k, v) => format!("{k} notin ({})", v.join(&format!(",{sp}"))),
        Req::Exists(k) => k.clone(),
        Req::NotExists(k) => format!("!{k}"),
    }
}

fn holds(r: &Req, l: &BTreeMap<String, String>) -> bool {
    match r {
        Req::Eq(k, v) => l.get(k) == Some(v),
        Req::NotEq(k, v) => l.get(k) != Some(v),
        Req::In(k, vs) => l.get(k).is_some_and(|x| vs.contains(x)),
        Req::NotIn(k, vs) => l.get(k).is_none_or(|x| !vs.contains(x)),
        Req::Exists(k) => l.contains_key(k),
        Req::NotExists(k) => !l.contains_key(k),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn printed_selectors_parse_and_match_like_the_model(
        reqs in proptest::collection::vec(req(), 0..5),
        labels in proptest::collection::btree_map(key(), val(), 0..4),
        spaced in any::<bool>(),
    ) {
        let text = reqs.iter().map(|r| print(r, spaced)).collect::<Vec<_>>().join(if spaced { ", " } else { "," });
        let sel = Selector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(sel.is_empty(), reqs.is_empty());
        let map: Map<String, Value> = labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let want = reqs.iter().all(|r| holds(r, &labels));
        prop_assert_eq!(sel.matches(Some(&map)), want, "{} on {:?}", text, labels);
    }
}
