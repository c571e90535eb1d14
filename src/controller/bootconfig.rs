//! The ServerBootConfiguration reconciler (boot side): decides `Ready` or `Error`
//! through the configured [`super::BootResolver`] and records why.

use serde_json::{json, Value};

use super::{set_condition, Controllers, Key, Next};
use crate::store::{meta, secret_data, Part, Store, StoreError};

pub async fn reconcile(c: &Controllers, key: &Key) -> Result<Next, StoreError> {
    let (ns, name) = key;
    let b = match c.store.get(&c.t_sbc, Some(ns), name) {
        Ok(b) => b,
        Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
        Err(e) => return Err(e),
    };
    if meta::is_deleting(&b) {
        return Ok(Next::Done);
    }
    let mut status = b.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut next = Next::Done;
    match c.resolver.resolve(&c.store, &b) {
        Ok(()) => {
            status["state"] = json!("Ready");
            set_condition(
                &mut status,
                "Ready",
                true,
                "Resolved",
                "image and ignition resolved",
            );
        }
        Err((reason, message)) => {
            status["state"] = json!("Error");
            set_condition(&mut status, "Ready", false, &reason, &message);
            // Files may appear or be fixed on disk without any store event: look again.
            next = Next::After(std::time::Duration::from_secs(15));
        }
    }
    if Some(&status) != b.get("status") {
        let mut o = (*b).clone();
        o["status"] = status;
        c.store.update(&c.t_sbc, o, Part::Status).await?;
    }
    Ok(next)
}

/// The ignition secret named by the configuration exists and has an `ignition` key.
pub fn check_secret(store: &Store, sbc: &Value) -> Result<(), (String, String)> {
    let ns = meta::namespace(sbc).unwrap_or("default");
    let Some(name) = sbc
        .pointer("/spec/ignitionSecretRef/name")
        .and_then(Value::as_str)
    else {
        return Ok(()); // no ignition wanted
    };
    let t = store.registry().resolve("secret").expect("secret type");
    let secret = store.get(&t, Some(ns), name).map_err(|_| {
        (
            "IgnitionSecretMissing".to_string(),
            format!("secret {ns}/{name} not found"),
        )
    })?;
    if secret_data(&secret, "ignition").is_none() {
        return Err((
            "IgnitionKeyMissing".into(),
            format!("secret {ns}/{name} has no data key \"ignition\""),
        ));
    }
    Ok(())
}
