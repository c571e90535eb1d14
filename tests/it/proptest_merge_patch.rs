//! Property tests of the API's JSON merge patch (`store::merge_patch`, RFC 7386), the
//! PATCH semantics of every resource: the laws that hold for merge patches.

use bootplane::store::merge_patch;
use proptest::prelude::*;
use serde_json::{Map, Value};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::String),
    ]
}

/// JSON values of small depth and width, keys from a small set so patches and targets
/// overlap.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-e]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The same without nulls inside objects (a merge patch cannot produce a null member).
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A merge patch that turns `a` into `b` (RFC 7386 section 2's reverse): `b` itself
/// where either is not an object, else per key: removed → null, changed → the diff.
fn diff(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Object(am), Value::Object(bm)) => {
            let mut p = Map::new();
            for k in am.keys() {
                if !bm.contains_key(k) {
                    p.insert(k.clone(), Value::Null);
                }
            }
            for (k, bv) in bm {
                match am.get(k) {
                    Some(av) if av == bv => {}
                    Some(av) => {
                        p.insert(k.clone(), diff(av, bv));
                    }
                    None => {
                        p.insert(k.clone(), diff(&Value::Null, bv));
                    }
                }
            }
            Value::Object(p)
        }
        (_, Value::Object(bm)) => {
            // Built up from `{}`: every member of `b`, recursively.
            Value::Object(
                bm.iter()
                    .map(|(k, v)| (k.clone(), diff(&Value::Null, v)))
                    .collect(),
            )
        }
        (_, b) => b.clone(),
    }
}

fn apply(t: &Value, p: &Value) -> Value {
    let mut t = t.clone();
    merge_patch(&mut t, p);
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Applying a patch twice changes nothing more than applying it once.
    #[test]
    fn idempotent(t in value(), p in value()) {
        let once = apply(&t, &p);
        prop_assert_eq!(apply(&once, &p), once);
    }

    /// The diff of two documents, applied to the first, gives the second (nulls inside
    /// objects cannot be expressed by a merge patch and are left out of `b`).
    #[test]
    fn diff_applies(a in value(), b in value()) {
        let b = strip_nulls(&b);
        prop_assert_eq!(apply(&a, &diff(&a, &b)), b);
    }

    /// A patch that is not an object replaces the target; `{}` keeps an object target
    /// and turns anything else into `{}`.
    #[test]
    fn replace_and_empty(t in value(), p in value()) {
        if !p.is_object() {
            prop_assert_eq!(apply(&t, &p), p);
        }
        let e = apply(&t, &Value::Object(Map::new()));
        if t.is_object() {
            prop_assert_eq!(e, t);
        } else {
            prop_assert_eq!(e, Value::Object(Map::new()));
        }
    }

    /// The result holds what the patch says: a null member deletes the key, any other
    /// non-object value replaces, objects merge recursively.
    #[test]
    fn nulls_delete(t in value(), p in value()) {
        fn check(r: &Value, p: &Value) -> bool {
            match (r, p) {
                (Value::Object(rm), Value::Object(pm)) => pm.iter().all(|(k, pv)| match pv {
                    Value::Null => !rm.contains_key(k),
                    pv => rm.get(k).is_some_and(|rv| check(rv, pv)),
                }),
                (r, p) => r == p,
            }
        }
        let r = apply(&t, &p);
        prop_assert!(check(&r, &p));
    }
}
