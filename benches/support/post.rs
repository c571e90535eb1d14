//! Applying many objects through bootplane's API from several client threads at once
//! (what an operator's tooling does at fleet registration).

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// POST every body to `api` + `path` (bearer `token`, through `agent`, e.g. the one a
/// `Bootplane` has for its API) from `clients` threads; panics on the first refusal.
pub fn post_all(
    agent: &ureq::Agent,
    api: &str,
    token: &str,
    path: &str,
    bodies: Vec<Value>,
    clients: usize,
) {
    let bodies = Arc::new(Mutex::new(bodies));
    std::thread::scope(|s| {
        for _ in 0..clients {
            let bodies = bodies.clone();
            s.spawn(move || {
                let agent = agent.clone();
                loop {
                    let Some(body) = bodies.lock().unwrap().pop() else {
                        return;
                    };
                    agent
                        .post(&format!("{api}{path}"))
                        .set("Authorization", &format!("Bearer {token}"))
                        .set("Content-Type", "application/json")
                        .send_string(&body.to_string())
                        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
                }
            });
        }
    });
}
