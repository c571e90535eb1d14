//! Lists in pages (`limit`, `continue`), as client-go, kubectl (`limit=500`) and
//! informers ask for them: items in key order (the store's [`crate::store::Page`]), at
//! most `limit` to a page, and a `continue` token naming the last key given, so the next
//! page starts after it. Each page is read when it is asked for: objects created or
//! deleted between pages show or go (kube reads every page at the first one's
//! resourceVersion; bootplane keeps no old versions to read). The token is opaque to
//! clients (base64url of the last key); a malformed one is 400. Also which versions a
//! list may ask for. Pure.

use super::error::ApiError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Longest `continue` token taken (a key is at most two 253-byte names).
const MAX_TOKEN: usize = 1024;

/// What a list asked for: a page size and where to start.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Paging {
    pub limit: Option<usize>,
    /// The last key of the page before.
    pub after: Option<String>,
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
}

/// The `continue` token for a page that ends at `key` ([`crate::store::Page::next`]).
pub(crate) fn token(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
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
    match key.is_empty() || key.chars().any(char::is_control) {
        true => Err(bad()),
        false => Ok(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tokens_round_trip() {
        for key in ["default/a", "srv-00001", "a-b/y"] {
            let p = Paging::from_query(&q(&[("continue", &token(key))]))
                .unwrap()
                .unwrap();
            assert_eq!((p.limit, p.after.as_deref()), (None, Some(key)));
        }
        let p = Paging::from_query(&q(&[("limit", "2")])).unwrap().unwrap();
        assert_eq!((p.limit, p.after), (Some(2), None));
    }

    #[test]
    fn no_paging_and_bad_input() {
        assert_eq!(Paging::from_query(&q(&[])).unwrap(), None);
        assert_eq!(Paging::from_query(&q(&[("limit", "0")])).unwrap(), None);
        for bad in [
            ("limit", "-1"),
            ("limit", "x"),
            ("continue", "!!"),
            ("continue", "AQ"),
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
