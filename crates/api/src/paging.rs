//! Lists in pages (`limit`, `continue`), as client-go, kubectl (`limit=500`) and
//! informers ask for them: items in key order (namespace, then name), at most `limit`
//! to a page, and a `continue` token naming the last key given, so the next page starts
//! after it. Each page is read when it is asked for: objects created or deleted between
//! pages show or go (kube reads every page at the first one's resourceVersion; bootplane
//! keeps no old versions to read). The token is opaque to clients (base64url of the
//! last key); a malformed one is 400. Pure.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::Value;

use super::error::ApiError;
use crate::model::meta;

/// Longest `continue` token taken (a key is at most two 253-byte names).
const MAX_TOKEN: usize = 1024;

/// What a list asked for: a page size and where to start.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Paging {
    limit: Option<usize>,
    after: Option<String>,
}

/// One page: its items, the token for the next (when there are more), and how many
/// come after it.
pub(crate) struct Page {
    pub items: Vec<Arc<Value>>,
    pub next: Option<String>,
    pub remaining: usize,
}

impl Paging {
    /// From a list's query: `None` when it asks for no paging (`limit` absent or 0 and
    /// no `continue`).
    pub(crate) fn from_query(
        q: &std::collections::HashMap<String, String>,
    ) -> Result<Option<Paging>, ApiError> {
        let limit = match q.get("limit").map(String::as_str) {
            None | Some("") | Some("0") => None,
            Some(s) => Some(s.parse::<usize>().map_err(|_| {
                ApiError::bad_request(format!("limit: not a non-negative number: {s:?}"))
            })?),
        };
        let after = match q.get("continue").map(String::as_str) {
            None | Some("") => None,
            Some(t) => Some(decode(t)?),
        };
        Ok((limit.is_some() || after.is_some()).then_some(Paging { limit, after }))
    }

    /// The page of `items` (any order) this asks for.
    pub(crate) fn page(&self, mut items: Vec<Arc<Value>>) -> Page {
        items.sort_by_cached_key(|o| key(o));
        if let Some(after) = &self.after {
            items.retain(|o| key(o) > *after);
        }
        let n = self.limit.unwrap_or(items.len());
        let remaining = items.len().saturating_sub(n);
        items.truncate(n);
        let next = (remaining > 0)
            .then(|| items.last().map(|o| URL_SAFE_NO_PAD.encode(key(o))))
            .flatten();
        Page {
            items,
            next,
            remaining,
        }
    }
}

/// An object's place in key order: `namespace/name` (`/name` when cluster-scoped).
fn key(o: &Value) -> String {
    format!(
        "{}/{}",
        meta::namespace(o).unwrap_or_default(),
        meta::name(o)
    )
}

/// Which state a list asked for (`resourceVersion`, `resourceVersionMatch`), checked
/// against the store's revision `current`. bootplane serves lists from the current
/// state only: one that asks for a version not newer than it (unset, `0`,
/// `NotOlderThan`) gets it; one newer than `current` is 504 (kube's "Too large
/// resource version"); one that asks for an older state exactly is 410 Expired (the
/// client lists again without it), as kube's for a compacted one.
pub(crate) fn check_version(
    q: &std::collections::HashMap<String, String>,
    current: crate::store::backend::Rev,
) -> Result<(), ApiError> {
    use axum::http::StatusCode;
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", m);
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let exact = match q.get("resourceVersionMatch").map(String::as_str) {
        None | Some("") => false,
        Some("NotOlderThan") => false,
        Some("Exact") => true,
        Some(m) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: unsupported value {m:?}: \"Exact\" or \"NotOlderThan\""
            )))
        }
    };
    let matched = q.get("resourceVersionMatch").is_some_and(|m| !m.is_empty());
    if matched && rv.is_empty() {
        return Err(invalid("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into()));
    }
    if rv.is_empty() || rv == "0" {
        if exact {
            return Err(invalid("resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into()));
        }
        return Ok(());
    }
    if q.get("continue").is_some_and(|c| !c.is_empty()) {
        return Err(ApiError::bad_request(
            "resourceVersion: a list with a continue token may not give one",
        ));
    }
    let asked: crate::store::backend::Rev = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
    if asked > current {
        return Err(crate::store::StoreError::TooLargeResourceVersion {
            requested: asked,
            current,
        }
        .into());
    }
    if exact && asked != current {
        return Err(ApiError::new(
            StatusCode::GONE,
            "Expired",
            format!(
                "too old resource version: {asked} ({current}): only the current state is kept"
            ),
        ));
    }
    Ok(())
}

fn decode(token: &str) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request("continue: invalid token (list again without it)");
    if token.len() > MAX_TOKEN {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let key = String::from_utf8(bytes).map_err(|_| bad())?;
    match key.contains('/') {
        true => Ok(key),
        false => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn objs(names: &[&str]) -> Vec<Arc<Value>> {
        (names.iter())
            .map(|n| Arc::new(json!({"metadata": {"name": n, "namespace": "default"}})))
            .collect()
    }

    fn names(p: &Page) -> Vec<&str> {
        p.items.iter().map(|o| meta::name(o)).collect()
    }

    #[test]
    fn pages_in_key_order_until_the_last() {
        let all = objs(&["c", "a", "e", "b", "d"]);
        let p = Paging::from_query(&q(&[("limit", "2")])).unwrap().unwrap();
        let one = p.page(all.clone());
        assert_eq!((names(&one), one.remaining), (vec!["a", "b"], 3));
        let token = one.next.clone().unwrap();
        let p = Paging::from_query(&q(&[("limit", "2"), ("continue", &token)]))
            .unwrap()
            .unwrap();
        let two = p.page(all.clone());
        assert_eq!(names(&two), ["c", "d"]);
        let p = Paging::from_query(&q(&[("limit", "2"), ("continue", &two.next.unwrap())]))
            .unwrap()
            .unwrap();
        let three = p.page(all);
        assert_eq!(
            (names(&three), three.next.clone(), three.remaining),
            (vec!["e"], None, 0)
        );
    }

    #[test]
    fn no_paging_and_bad_input() {
        assert_eq!(Paging::from_query(&q(&[])).unwrap(), None);
        assert_eq!(Paging::from_query(&q(&[("limit", "0")])).unwrap(), None);
        for bad in [
            ("limit", "-1"),
            ("limit", "x"),
            ("continue", "!!"),
            ("continue", "bm8tc2xhc2g"),
        ] {
            let e = Paging::from_query(&q(&[bad])).unwrap_err();
            assert_eq!(e.code, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
        let long = "A".repeat(MAX_TOKEN + 1);
        assert!(Paging::from_query(&q(&[("continue", &long)])).is_err());
    }

    #[test]
    fn versions_a_list_may_ask_for() {
        use axum::http::StatusCode as C;
        let code = |pairs: &[(&str, &str)]| check_version(&q(pairs), 10).err().map(|e| e.code);
        assert_eq!(code(&[]), None);
        assert_eq!(code(&[("resourceVersion", "0")]), None);
        assert_eq!(code(&[("resourceVersion", "7")]), None);
        assert_eq!(
            code(&[
                ("resourceVersion", "7"),
                ("resourceVersionMatch", "NotOlderThan")
            ]),
            None
        );
        assert_eq!(
            code(&[("resourceVersion", "10"), ("resourceVersionMatch", "Exact")]),
            None
        );
        assert_eq!(
            code(&[("resourceVersion", "7"), ("resourceVersionMatch", "Exact")]),
            Some(C::GONE)
        );
        assert_eq!(code(&[("resourceVersion", "11")]), Some(C::GATEWAY_TIMEOUT));
        assert_eq!(
            code(&[("resourceVersionMatch", "Exact")]),
            Some(C::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            code(&[("resourceVersion", "0"), ("resourceVersionMatch", "Exact")]),
            Some(C::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(code(&[("resourceVersion", "x")]), Some(C::BAD_REQUEST));
        assert_eq!(
            code(&[("resourceVersion", "1"), ("resourceVersionMatch", "Newest")]),
            Some(C::BAD_REQUEST)
        );
        assert_eq!(
            code(&[("resourceVersion", "1"), ("continue", "abc")]),
            Some(C::BAD_REQUEST)
        );
    }
}
