//! Named API tokens (`bp1.NAME.SECRET`, an `APIToken` object per NAME holding the role,
//! the expiry and the SHA-256 of SECRET): the names and limits of the format, the hash,
//! and [`TokenUse`], the throttled record of a token's last use. Authentication with a
//! token is `auth::authenticate_token`; making one is `auth::issue`.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::model::registry::Registry;
use crate::store::Store;

/// The API group of `APIToken`.
pub(crate) const GROUP: &str = "auth.bootplane.dev";
/// The plural of `APIToken`.
pub(crate) const TOKENS: &str = "apitokens";
/// The user of the bootstrap token (`[api] token` or `<state_dir>/api-token`).
pub(crate) const BOOTSTRAP_USER: &str = "admin";
/// How named tokens start (the format's version).
pub(crate) const TOKEN_PREFIX: &str = "bp1.";
/// The longest lifetime a token may be created with (10 years).
pub(crate) const MAX_TTL_SECONDS: u64 = 10 * 366 * 86_400;

/// Constant-time equality of two byte strings (their lengths are not secret).
pub(super) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `sha256:<hex>` of a token's secret part, as stored in `spec.secretHash`.
pub(crate) fn secret_hash(secret: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(secret.as_bytes())))
}

/// A name a token may have: a DNS label (no dots, so `bp1.NAME.SECRET` splits one way).
pub(crate) fn valid_token_name(n: &str) -> bool {
    crate::model::meta::valid_dns_label(n)
}

pub use crate::model::wire::LAST_USED;
/// How often a token's [`LAST_USED`] is written at most.
pub(crate) const LAST_USED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// The lifetime of a token made without `spec.ttlSeconds` (90 days); `0` asks for none.
pub(crate) const DEFAULT_TTL_SECONDS: u64 = 90 * 86_400;

/// When each named token was last noted as used (in this process), so that a token's
/// use costs a store write at most once a minute, not once a request.
#[derive(Default)]
pub struct TokenUse {
    seen: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl TokenUse {
    /// `user` just authenticated with a bearer token: if it is a named token not noted
    /// within [`LAST_USED_EVERY`] (here, or in its stored annotation), write its
    /// [`LAST_USED`] in the background.
    pub(crate) fn note(&self, store: &Store, user: &str) {
        let now = std::time::Instant::now();
        {
            let mut m = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if m.get(user)
                .is_some_and(|t| now.duration_since(*t) < LAST_USED_EVERY)
            {
                return;
            }
            if m.len() >= 4096 {
                m.retain(|_, t| now.duration_since(*t) < LAST_USED_EVERY);
            }
            m.insert(user.to_string(), now);
        }
        let Some(rt) = Registry::global().by_plural(GROUP, "v1alpha1", TOKENS) else {
            return;
        };
        // The bootstrap token and certificate users have no object.
        let Ok(obj) = store.get(&rt, None, user) else {
            return;
        };
        let wall = chrono::Utc::now();
        if let Some(t) = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(LAST_USED))
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        {
            if wall.signed_duration_since(t)
                < chrono::Duration::from_std(LAST_USED_EVERY).unwrap_or_default()
            {
                return;
            }
        }
        let patch = json!({"metadata": {"annotations": {
            LAST_USED: wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        }}});
        let (store, name) = (store.clone(), user.to_string());
        tokio::spawn(async move {
            if let Err(e) = store
                .patch(&rt, None, &name, &patch, crate::store::Part::Main)
                .await
            {
                tracing::debug!(token = %name, error = %e, "recording a token's last use");
            }
        });
    }
}
