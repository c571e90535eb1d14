//! The ServerClaim reconciler: binds a claim to a server, creates its
//! ServerBootConfiguration, and on deletion undoes both.
//!
//! Choice of server (deterministic): with `spec.serverRef`, that server; otherwise
//! the claimable server with the lowest name that matches `spec.serverSelector`,
//! whose NoBind taints the claim tolerates, and that no concurrent reconcile is
//! trying at that moment (candidates are reserved in memory while tried, so parallel
//! workers spread instead of colliding). A server already bound to this claim is
//! always preferred, so a restart mid-way finishes the same binding.
//!
//! Binding is a compare-and-swap on the server (`spec.serverClaimRef` set against the
//! resourceVersion that was read), so two claims can never take one server. A first
//! binding (the claim has no boot configuration yet) is one transaction
//! ([`crate::store::Write`]): the server (and the status its reconciler would give it:
//! Reserved, its conditions, when no power action is needed), the claim (finalizer,
//! `spec.serverRef`, `status.phase: Bound`) and the boot configuration with the status
//! the resolver gives it; a conflict on the server tries the next candidate, one on the
//! claim reconciles again. On etcd that is one revision where the steps took six (with
//! the claim's create and the Events batched apart, measured by `benches/claims.rs`).
//! Otherwise (a boot configuration left from before), the steps one by one, in an order
//! chosen so that a crash between any two is finished by the next reconcile: bind
//! server → claim finalizer + `spec.serverRef` → boot configuration → claim
//! `status.phase: Bound`.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{
    claim_ref, claimable_view, is_claimable, set_condition, Controllers, Key, Next, CLAIM_FINALIZER,
};
use crate::model::meta;
use crate::model::views::{
    read, BootConfigurationState, ClaimPhase, PowerState, Server, ServerClaim, Taint, TaintEffect,
    TolerationOperator,
};
use crate::store::{Part, StoreError, Write};

/// Whether `claim` tolerates every `NoBind` taint of a server (`Evict` taints do not
/// keep a claim from binding).
fn tolerates(claim: &ServerClaim, taints: &[Taint]) -> bool {
    taints.iter().all(|t| {
        let effect = t.effect.clone().unwrap_or(TaintEffect::NoBind);
        if effect != TaintEffect::NoBind {
            return true;
        }
        let key = Some(t.key.as_str());
        claim.spec.tolerations.iter().any(|tol| {
            if tol.effect.as_ref().is_some_and(|e| *e != effect) {
                return false;
            }
            match tol.operator.as_ref().unwrap_or(&TolerationOperator::Equal) {
                TolerationOperator::Exists => tol.key.as_deref().is_none_or(|k| Some(k) == key),
                _ => tol.key.as_deref() == key && tol.value.as_deref() == t.value.as_deref(),
            }
        })
    })
}

/// Write the claim's phase and its `Bound` condition (status, reason, message) when
/// either changed; the change is recorded as Events.
async fn set_phase(
    c: &Controllers,
    claim: &Arc<Value>,
    phase: ClaimPhase,
    (bound, reason, message): (bool, &str, &str),
) -> Result<(), StoreError> {
    let old = claim.get("status");
    let mut status = old.cloned().unwrap_or_else(|| json!({}));
    status["phase"] = json!(phase);
    set_condition(&mut status, "Bound", bound, reason, message);
    if old == Some(&status) {
        return Ok(());
    }
    c.store
        .update_status(&c.t_claim, claim, status.clone())
        .await?;
    c.events.status_change(&c.t_claim, claim, old, &status);
    Ok(())
}

/// Why a claim waits, as its `Bound` condition's reason and message: no Server
/// matches its selector (or the one it names does not exist), or every match is taken
/// and by what. Worked out from the controllers' index of every Server.
fn why_waiting(c: &Controllers, claim: &ServerClaim) -> (&'static str, String) {
    let idx = c.idx.lock().unwrap();
    if let Some(n) = server_ref(claim) {
        return match idx.servers.get(n) {
            None => ("NoMatchingServer", format!("server {n} named by spec.serverRef does not exist")),
            Some((_, Some(why))) => ("AllMatchingServersTaken", format!("server {n} named by spec.serverRef cannot be claimed: {why}")),
            Some((v, None)) if !tolerates(claim, &v.taints) => ("AllMatchingServersTaken", format!("server {n} named by spec.serverRef has a NoBind taint the claim does not tolerate")),
            Some(_) => ("Waiting", format!("server {n} is being bound")),
        };
    }
    let sel = claim.spec.server_selector.as_ref().filter(|s| !s.is_null());
    let selector = claim.selector().ok().flatten();
    let shown = match sel {
        Some(s) => format!("the selector {s}"),
        None => "the claim (no selector: any server)".to_string(),
    };
    let mut matching = 0usize;
    let mut taken = Vec::new();
    for (n, (v, why)) in &idx.servers {
        if selector
            .as_ref()
            .is_some_and(|sel| !sel.matches(v.labels()))
        {
            continue;
        }
        matching += 1;
        let why = match why {
            Some(w) => w.clone(),
            None if !tolerates(claim, &v.taints) => "NoBind taint not tolerated".into(),
            None => continue,
        };
        if taken.len() < 5 {
            taken.push(format!("{n} ({why})"));
        }
    }
    if matching == 0 {
        let total = idx.servers.len();
        return (
            "NoMatchingServer",
            format!("no server matches {shown} ({total} servers registered)"),
        );
    }
    let more = matching.saturating_sub(taken.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    (
        "AllMatchingServersTaken",
        format!(
            "{matching} server(s) match {shown}, none can be claimed: {}{tail}",
            taken.join(", ")
        ),
    )
}

pub(crate) async fn reconcile(c: &Controllers, key: &Key) -> Result<Next, StoreError> {
    let (ns, name) = key;
    let claim = match c.store.get(&c.t_claim, Some(ns), name) {
        Ok(o) => o,
        Err(StoreError::NotFound { .. }) => {
            c.idx.lock().unwrap().waiting.remove(key);
            return Ok(Next::Done);
        }
        Err(e) => return Err(e),
    };
    let cv: ServerClaim = read(&claim);
    if cv.metadata.is_deleting() {
        return finalize(c, key, &claim, &cv).await;
    }

    // Find the server bound to this claim, or bind one.
    let bound = find_bound(c, key, &cv);
    let server = match bound {
        Some(s) => s,
        None => match bind(c, key, (&claim, &cv)).await? {
            // Server, claim, boot configuration and their status written at once.
            Some(Binding::Whole) => {
                let mut idx = c.idx.lock().unwrap();
                idx.waiting.remove(key);
                idx.explained.remove(key);
                return Ok(Next::Done);
            }
            Some(Binding::Server(s)) => s,
            None => {
                let explain = {
                    let mut idx = c.idx.lock().unwrap();
                    idx.waiting.insert(key.clone());
                    let due = idx
                        .explained
                        .get(key)
                        .is_none_or(|t| t.elapsed() >= super::EXPLAIN_EVERY);
                    if due {
                        idx.explained.insert(key.clone(), std::time::Instant::now());
                    }
                    due
                };
                if explain {
                    let (reason, message) = why_waiting(c, &cv);
                    let why = (false, reason, message.as_str());
                    set_phase(c, &claim, ClaimPhase::Unbound, why).await?;
                } else if cv.status.phase != Some(ClaimPhase::Unbound) {
                    set_phase(
                        c,
                        &claim,
                        ClaimPhase::Unbound,
                        (false, "Waiting", "waiting for a server"),
                    )
                    .await?;
                }
                // Re-queued when a server becomes claimable; looked at again after
                // EXPLAIN_EVERY so the reason follows the fleet.
                return Ok(Next::After(super::EXPLAIN_EVERY));
            }
        },
    };
    {
        let mut idx = c.idx.lock().unwrap();
        idx.waiting.remove(key);
        idx.explained.remove(key);
    }
    let server_name = meta::name(&server).to_string();

    // Finalizer and the pinned serverRef in one write.
    let mut fins = cv.metadata.finalizers.clone();
    let has_ref = server_ref(&cv) == Some(server_name.as_str());
    let claim = if !fins.iter().any(|f| f == CLAIM_FINALIZER) || !has_ref {
        let mut o = (*claim).clone();
        if !fins.iter().any(|f| f == CLAIM_FINALIZER) {
            fins.push(CLAIM_FINALIZER.into());
            o["metadata"]["finalizers"] = json!(fins);
        }
        if !has_ref {
            o["spec"]["serverRef"] = json!({"name": server_name});
        }
        c.store
            .update_from(&c.t_claim, claim, o, Part::Main)
            .await?
    } else {
        claim
    };

    ensure_boot_configuration(c, ns, name, (&claim, &cv), &server_name).await?;

    // Keep the server's wanted power in step with the claim.
    let want = wanted_power(&cv);
    if read::<Server>(&server)
        .spec
        .power
        .as_ref()
        .map(PowerState::as_str)
        != Some(want)
    {
        c.store
            .patch(
                &c.t_server,
                None,
                &server_name,
                &json!({"spec": {"power": want}}),
                Part::Main,
            )
            .await?;
    }
    set_phase(
        c,
        &claim,
        ClaimPhase::Bound,
        (true, "Bound", &format!("bound to server {server_name}")),
    )
    .await?;
    Ok(Next::Done)
}

/// The name in the claim's `spec.serverRef`, when it names one.
fn server_ref(claim: &ServerClaim) -> Option<&str> {
    (claim.spec.server_ref.as_ref())
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty())
}

/// The power the claim asks for (`Off` when it says nothing).
fn wanted_power(claim: &ServerClaim) -> &str {
    claim.spec.power.as_ref().map_or("Off", PowerState::as_str)
}

fn find_bound(c: &Controllers, key: &Key, claim: &ServerClaim) -> Option<Arc<Value>> {
    let by_ref = server_ref(claim).map(String::from);
    let by_idx = c.idx.lock().unwrap().bound.get(key).cloned();
    for n in by_ref.into_iter().chain(by_idx) {
        if let Ok(s) = c.store.get(&c.t_server, None, &n) {
            if claim_ref(&read(&s)).as_ref() == Some(key) {
                return Some(s);
            }
        }
    }
    None
}

/// What [`bind`] wrote.
enum Binding {
    /// The whole binding, in one transaction ([`bind_whole`]): nothing is left to do.
    Whole,
    /// Only the server's `spec.serverClaimRef` (the claim has a boot configuration
    /// already, from an earlier binding): the steps after it follow.
    Server(Arc<Value>),
}

/// Try to bind a server. `Ok(None)` when none is available.
async fn bind(
    c: &Controllers,
    key: &Key,
    (claim_obj, claim): (&Arc<Value>, &ServerClaim),
) -> Result<Option<Binding>, StoreError> {
    let (ns, name) = key;
    // A first binding (no boot configuration yet) is written whole.
    let whole = matches!(
        c.store.get(&c.t_sbc, Some(ns), name),
        Err(StoreError::NotFound { .. })
    );
    let selector = claim.selector().map_err(StoreError::BadRequest)?;
    // Candidates are taken out of the claimable index as they are tried (a tentative,
    // in-memory reservation), so concurrent reconciles spread over different servers
    // instead of all racing for the lowest name. Exclusivity itself still comes only
    // from the compare-and-swap below; a server that stays claimable is put back by
    // its next watch event, or here when the attempt failed for another reason.
    let by_ref = server_ref(claim).map(String::from);
    let mut tried_any = false;
    for attempt in 0.. {
        let n = match (&by_ref, attempt) {
            (Some(n), 0) => n.clone(),
            (Some(_), _) => break,
            (None, _) if attempt >= 8 => break,
            (None, _) => {
                let mut idx = c.idx.lock().unwrap();
                let pick = idx
                    .claimable
                    .iter()
                    .find(|(_, s)| {
                        selector.as_ref().is_none_or(|sel| sel.matches(s.labels()))
                            && tolerates(claim, &s.taints)
                    })
                    .map(|(n, _)| n.clone());
                match pick {
                    Some(n) => {
                        idx.claimable.remove(&n);
                        n
                    }
                    None => break,
                }
            }
        };
        tried_any = true;
        let s = match c.store.get(&c.t_server, None, &n) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let sv: Server = read(&s);
        if !is_claimable(&sv)
            || !tolerates(claim, &sv.spec.taints)
            || selector
                .as_ref()
                .is_some_and(|sel| !sel.matches(meta::labels(&s)))
        {
            if by_ref.is_none() && is_claimable(&sv) {
                // Claimable, just not for this claim: give it back.
                c.idx
                    .lock()
                    .unwrap()
                    .claimable
                    .insert(n.clone(), claimable_view(&sv));
            }
            continue;
        }
        let mut o = (*s).clone();
        o["spec"]["serverClaimRef"] = json!({"name": name, "namespace": ns});
        o["spec"]["bootConfigurationRef"] = json!({"name": name, "namespace": ns});
        o["spec"]["power"] = json!(wanted_power(claim));
        let written = if whole {
            bind_whole(c, key, (claim_obj, claim), s, o).await
        } else {
            (c.store.update_from(&c.t_server, s, o, Part::Main).await).map(Binding::Server)
        };
        match written {
            Ok(b) => {
                let mut idx = c.idx.lock().unwrap();
                idx.claimable.remove(&n);
                idx.bound.insert(key.clone(), n.clone());
                idx.bound_by_server.insert(n.clone(), key.clone());
                tracing::info!(claim = %format!("{ns}/{name}"), server = %n, "claim bound");
                return Ok(Some(b));
            }
            // The server changed under us: its watch event re-indexes it.
            Err(StoreError::Conflict { qualified, .. }) if qualified == c.t_server.qualified() => {
                continue
            }
            Err(e) => {
                if let Ok(s) = c.store.get(&c.t_server, None, &n) {
                    let sv: Server = read(&s);
                    if is_claimable(&sv) {
                        c.idx
                            .lock()
                            .unwrap()
                            .claimable
                            .insert(n.clone(), claimable_view(&sv));
                    }
                }
                return Err(e);
            }
        }
    }
    // Every candidate we saw was taken or changed meanwhile: look again soon (the
    // index has been pruned of them). With no candidates at all, the claim waits.
    if !tried_any {
        return Ok(None);
    }
    if claim.spec.server_ref.is_none() {
        return Err(StoreError::Conflict {
            qualified: "servers.metal.ironcore.dev".into(),
            name: "(candidates)".into(),
            message: "all candidate servers were taken concurrently".into(),
        });
    }
    Ok(None)
}

/// The first binding of a claim in one transaction: the server (`cur` → `server`, its
/// spec naming the claim, and its status as its reconciler would make it), the claim
/// (finalizer, `spec.serverRef`, `status.phase: Bound`) and a new boot configuration
/// with its status from the resolver. On etcd that is one revision where the steps one
/// by one took six. The Events each reconciler would record are recorded here.
async fn bind_whole(
    c: &Controllers,
    (ns, name): &Key,
    (claim_obj, claim): (&Arc<Value>, &ServerClaim),
    cur: Arc<Value>,
    mut server: Value,
) -> Result<Binding, StoreError> {
    let server_name = meta::name(&cur).to_string();
    let sbc = boot_configuration(c, (ns, name), (claim_obj, claim), &server_name);
    let mut sbc_status = json!({});
    let state = match c.resolver.resolve(&c.store, &sbc) {
        Ok(()) => {
            set_condition(
                &mut sbc_status,
                "Ready",
                true,
                "Resolved",
                "image and ignition resolved",
            );
            BootConfigurationState::Ready
        }
        Err((reason, message)) => {
            set_condition(&mut sbc_status, "Ready", false, &reason, &message);
            BootConfigurationState::Error
        }
    };
    sbc_status["state"] = json!(state);
    let mut sbc = sbc;
    sbc["status"] = sbc_status;
    let server_status = super::server::status_when_bound(&server, &read(&server), Some(&state));
    if let Some(st) = &server_status {
        server["status"] = st.clone();
    }
    let mut o = (**claim_obj).clone();
    let mut fins = claim.metadata.finalizers.clone();
    if !fins.iter().any(|f| f == CLAIM_FINALIZER) {
        fins.push(CLAIM_FINALIZER.into());
    }
    o["metadata"]["finalizers"] = json!(fins);
    o["spec"]["serverRef"] = json!({"name": server_name});
    let mut status = claim_obj
        .get("status")
        .cloned()
        .unwrap_or_else(|| json!({}));
    status["phase"] = json!(ClaimPhase::Bound);
    let bound_to = format!("bound to server {server_name}");
    set_condition(&mut status, "Bound", true, "Bound", &bound_to);
    o["status"] = status;
    let out = c
        .store
        .write_all(vec![
            Write::Replace(&c.t_server, cur.clone(), server),
            Write::Replace(&c.t_claim, claim_obj.clone(), o),
            Write::Create(&c.t_sbc, sbc),
        ])
        .await?;
    let ev = &c.events;
    if server_status.is_some() {
        ev.status_change(&c.t_server, &cur, cur.get("status"), &out[0]["status"]);
    }
    ev.status_change(
        &c.t_claim,
        claim_obj,
        claim_obj.get("status"),
        &out[1]["status"],
    );
    ev.status_change(&c.t_sbc, &out[2], None, &out[2]["status"]);
    Ok(Binding::Whole)
}

/// A new boot configuration for the claim `name` on `server` (without status).
fn boot_configuration(
    c: &Controllers,
    (ns, name): (&str, &str),
    (claim, cv): (&Value, &ServerClaim),
    server: &str,
) -> Value {
    json!({
        "apiVersion": c.t_sbc.api_version(),
        "kind": "ServerBootConfiguration",
        "metadata": {
            "name": name,
            "namespace": ns,
            "ownerReferences": super::controller_ref(&c.t_claim, claim),
        },
        "spec": boot_spec(cv, server),
    })
}

/// The spec of the claim's boot configuration on `server`.
fn boot_spec(cv: &ServerClaim, server: &str) -> Value {
    let mut spec = json!({
        "serverRef": {"name": server},
        "image": cv.spec.image,
    });
    if let Some(r) = &cv.spec.ignition_secret_ref {
        spec["ignitionSecretRef"] = json!({"name": r.name});
    }
    spec
}

async fn ensure_boot_configuration(
    c: &Controllers,
    ns: &str,
    name: &str,
    (claim, cv): (&Value, &ServerClaim),
    server: &str,
) -> Result<(), StoreError> {
    let spec = boot_spec(cv, server);
    match c.store.get(&c.t_sbc, Some(ns), name) {
        Ok(b) => {
            if b.get("spec") != Some(&spec) {
                let mut o = (*b).clone();
                o["spec"] = spec;
                c.store.update_from(&c.t_sbc, b, o, Part::Main).await?;
            }
            Ok(())
        }
        Err(StoreError::NotFound { .. }) => {
            let obj = boot_configuration(c, (ns, name), (claim, cv), server);
            match c.store.create(&c.t_sbc, obj).await {
                Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Claim deletion: remove the boot configuration, release the server (the server
/// reconciler wipes it by the cleanup policy, the claim's annotation
/// `bootplane.dev/cleanup-policy` included, powers it off and applies its reclaim
/// policy), drop the finalizer.
async fn finalize(
    c: &Controllers,
    key: &Key,
    claim: &Value,
    cv: &ServerClaim,
) -> Result<Next, StoreError> {
    let (ns, name) = key;
    match c.store.delete(&c.t_sbc, Some(ns), name, None).await {
        Ok(_) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    if let Some(s) = find_bound(c, key, cv) {
        // The tenant's wipe policy goes with the server (the claim is about to be gone);
        // the server's cleanup applies the stronger of it and its own.
        let asked = cv
            .metadata
            .annotations
            .get(super::cleanup::POLICY_ANNOTATION)
            .filter(|p| super::cleanup::WipePolicy::parse(p).is_some());
        let patch = json!({
            "metadata": {"annotations": {super::cleanup::CLAIM_POLICY_ANNOTATION: asked}},
            "spec": {"serverClaimRef": null, "bootConfigurationRef": null, "power": "Off"},
        });
        c.store
            .patch(&c.t_server, None, meta::name(&s), &patch, Part::Main)
            .await?;
        c.idx.lock().unwrap().bound.remove(key);
    }
    let fins: Vec<String> = meta::finalizers(claim)
        .into_iter()
        .filter(|f| f != CLAIM_FINALIZER)
        .collect();
    if fins.len() != meta::finalizers(claim).len() {
        let mut o = claim.clone();
        o["metadata"]["finalizers"] = json!(fins);
        c.store.update(&c.t_claim, o, Part::Main).await?;
    }
    c.idx.lock().unwrap().waiting.remove(key);
    Ok(Next::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(spec: Value) -> ServerClaim {
        read(&json!({ "spec": spec }))
    }

    #[test]
    fn taints_need_tolerations() {
        let s = read::<Server>(
            &json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoBind"}]}}),
        )
        .spec
        .taints;
        assert!(!tolerates(&claim(json!({})), &s));
        assert!(tolerates(
            &claim(json!({"tolerations": [{"key": "gpu", "operator": "Exists"}]})),
            &s
        ));
        assert!(tolerates(
            &claim(json!({"tolerations": [{"key": "gpu", "value": "yes"}]})),
            &s
        ));
        assert!(!tolerates(
            &claim(json!({"tolerations": [{"key": "gpu", "value": "no"}]})),
            &s
        ));
        assert!(!tolerates(
            &claim(
                json!({"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "Evict"}]})
            ),
            &s
        ));
        // No effect on the taint: NoBind.
        let bare = read::<Server>(&json!({"spec": {"taints": [{"key": "gpu"}]}}))
            .spec
            .taints;
        assert!(!tolerates(&claim(json!({})), &bare));
        assert!(tolerates(
            &claim(json!({"tolerations": [{"operator": "Exists"}]})),
            &bare
        ));
        let evict = read::<Server>(&json!({"spec": {"taints": [{"key": "x", "effect": "Evict"}]}}))
            .spec
            .taints;
        assert!(tolerates(&claim(json!({})), &evict));
    }
}
