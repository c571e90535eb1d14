//! The client: [`Pool`] (TLS, limits, sessions) and [`Bmc`] (one BMC's calls).
//!
//! CONTRACT (the lead wrote the signatures; the client work fills the bodies and may add
//! private helpers, but keeps these public signatures).
//!
//! Every request goes through [`Bmc::call`]: credentials (session or basic, see
//! `transport`), then [`Bmc::send_retrying`] (backoff with full jitter on connect errors,
//! timeouts, 5xx and 429), then one attempt in `transport` under the per-BMC and the
//! global semaphore. PATCHes add `If-Match`; actions answered `202` follow the task
//! monitor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::parse::{self, TaskProgress};
use super::transport::{self, Auth, Counters, Failure, Line, Req, Resp};
use super::types::*;

/// Per-BMC request counters (tests and the benchmark read them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BmcStats {
    /// Requests sent (every attempt counts).
    pub requests: u64,
    /// The most requests in flight at once.
    pub max_in_flight: u64,
}

/// Shared by every BMC: TLS configuration, the global and per-BMC concurrency limits,
/// sessions, counters. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

pub(super) struct PoolInner {
    pub(super) settings: Settings,
    /// Verifies against `settings.ca_pem` only.
    pub(super) verified: reqwest::Client,
    /// For `Target.insecure`: accepts any certificate.
    pub(super) insecure: reqwest::Client,
    pub(super) global: Semaphore,
    bmcs: Mutex<HashMap<String, Arc<Shared>>>,
}

/// What all handles on one BMC (one `base_url`) share.
pub(super) struct Shared {
    pub(super) limit: Semaphore,
    pub(super) counters: Mutex<Counters>,
    /// Credentials per username (single-flight: the first request discovers them).
    pub(super) auth: tokio::sync::Mutex<HashMap<String, Auth>>,
    /// Refused credential attempts (see [`AuthBudget`]).
    pub(super) budget: Mutex<AuthBudget>,
}

/// The refused credential attempts on one BMC within the interval, for one set of
/// credentials (a hash of username and password: a change starts a new budget).
#[derive(Default)]
pub(super) struct AuthBudget {
    credentials: u64,
    refused: std::collections::VecDeque<Instant>,
}

impl AuthBudget {
    fn window(&mut self, credentials: u64, interval: Duration, now: Instant) {
        if self.credentials != credentials {
            self.credentials = credentials;
            self.refused.clear();
        }
        while self
            .refused
            .front()
            .is_some_and(|t| now.duration_since(*t) >= interval)
        {
            self.refused.pop_front();
        }
    }

    /// `Err` when `max` attempts were refused within `interval` (nothing may be sent).
    fn check(
        &mut self,
        credentials: u64,
        max: u32,
        interval: Duration,
        now: Instant,
    ) -> Result<(), Error> {
        self.window(credentials, interval, now);
        if self.refused.len() < max.max(1) as usize {
            return Ok(());
        }
        let oldest = *self.refused.front().expect("non-empty");
        let left = interval.saturating_sub(now.duration_since(oldest));
        Err(Error::AuthThrottled {
            attempts: self.refused.len() as u32,
            retry_in_secs: left.as_secs() + u64::from(left.subsec_nanos() > 0),
        })
    }

    fn refused(&mut self, credentials: u64, interval: Duration, now: Instant) {
        self.window(credentials, interval, now);
        self.refused.push_back(now);
    }

    fn accepted(&mut self, credentials: u64) {
        self.credentials = credentials;
        self.refused.clear();
    }
}

fn client(settings: &Settings, insecure: bool) -> Result<reqwest::Client, Error> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .connect_timeout(settings.timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .danger_accept_invalid_certs(insecure);
    if let Some(pem) = &settings.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| Error::Tls(format!("ca bundle: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Tls("ca bundle holds no certificate".into()));
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build()
        .map_err(|e| Error::Tls(format!("building the http client: {e}")))
}

impl Pool {
    pub fn new(settings: Settings) -> Result<Pool, Error> {
        let verified = client(&settings, false)?;
        let insecure = client(&settings, true)?;
        let global = Semaphore::new(settings.global_concurrency.max(1));
        Ok(Pool {
            inner: Arc::new(PoolInner {
                settings,
                verified,
                insecure,
                global,
                bmcs: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn shared(&self, base_url: &str) -> Arc<Shared> {
        let mut bmcs = self.inner.bmcs.lock().unwrap_or_else(|p| p.into_inner());
        bmcs.entry(base_url.to_owned())
            .or_insert_with(|| {
                Arc::new(Shared {
                    limit: Semaphore::new(self.inner.settings.per_bmc_concurrency.max(1)),
                    counters: Mutex::new(Counters::default()),
                    auth: tokio::sync::Mutex::new(HashMap::new()),
                    budget: Mutex::new(AuthBudget::default()),
                })
            })
            .clone()
    }

    /// A handle on one BMC (cheap; sessions and limits are shared through the pool,
    /// keyed by `base_url` and username).
    pub fn bmc(&self, target: Target) -> Bmc {
        let base_url = target.base_url.trim_end_matches('/').to_owned();
        let shared = self.shared(&base_url);
        Bmc {
            inner: Arc::new(BmcInner {
                pool: self.inner.clone(),
                shared,
                target: Target { base_url, ..target },
            }),
        }
    }

    /// Counters of the BMC at `base_url`.
    pub fn stats(&self, base_url: &str) -> BmcStats {
        let bmcs = self.inner.bmcs.lock().unwrap_or_else(|p| p.into_inner());
        bmcs.get(base_url.trim_end_matches('/'))
            .map(|s| {
                let c = s.counters.lock().unwrap_or_else(|p| p.into_inner());
                BmcStats {
                    requests: c.requests,
                    max_in_flight: c.max_in_flight,
                }
            })
            .unwrap_or_default()
    }
}

/// One BMC.
#[derive(Clone)]
pub struct Bmc {
    inner: Arc<BmcInner>,
}

pub(super) struct BmcInner {
    pub(super) pool: Arc<PoolInner>,
    pub(super) shared: Arc<Shared>,
    pub(super) target: Target,
}

/// The Redfish service root every BMC serves.
const ROOT: &str = "/redfish/v1/";
/// Host NICs read per system; a BMC listing more is cut here.
pub(crate) const MAX_NICS: usize = 64;

impl Bmc {
    /// What one attempt on this BMC needs (its client, limits and counters).
    fn line(&self) -> Line<'_> {
        let (pool, shared) = (&self.inner.pool, &self.inner.shared);
        Line {
            client: if self.inner.target.insecure {
                &pool.insecure
            } else {
                &pool.verified
            },
            timeout: pool.settings.timeout,
            base_url: &self.inner.target.base_url,
            bmc_limit: &shared.limit,
            global: &pool.global,
            counters: &shared.counters,
        }
    }

    pub async fn service_root(&self) -> Result<ServiceRoot, Error> {
        let (v, _) = self.get(ROOT).await?;
        Ok(parse::service_root(&v))
    }

    /// `@odata.id`s of `/redfish/v1/Systems` members.
    pub async fn systems(&self) -> Result<Vec<String>, Error> {
        let (v, _) = self.get("/redfish/v1/Systems").await?;
        parse::members(&v)
    }

    /// A system by `@odata.id`.
    pub async fn system(&self, odata_id: &str) -> Result<System, Error> {
        let (v, etag) = self.get(odata_id).await?;
        Ok(parse::system(&v, odata_id, etag))
    }

    /// The system whose UUID is `uuid` (case-insensitive), or the only system when
    /// `uuid` is `None`; `Error::Unsupported` names what was not found.
    pub async fn find_system(&self, uuid: Option<&str>) -> Result<System, Error> {
        let ids = self.systems().await?;
        let Some(uuid) = uuid else {
            return match ids.as_slice() {
                [only] => self.system(only).await,
                _ => Err(Error::Unsupported(format!(
                    "a single system (it has {})",
                    ids.len()
                ))),
            };
        };
        for id in &ids {
            let s = self.system(id).await?;
            if s.uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
            {
                return Ok(s);
            }
        }
        Err(Error::Unsupported(format!("a system with uuid {uuid}")))
    }

    pub async fn manager(&self, odata_id: &str) -> Result<Manager, Error> {
        let (v, _) = self.get(odata_id).await?;
        Ok(parse::manager(&v, odata_id))
    }

    /// `POST` the system's reset action; follows a task monitor to completion.
    /// `Error::Unsupported` when the BMC lists its reset types and `kind` is not one.
    pub async fn reset(&self, system: &System, kind: ResetType) -> Result<(), Error> {
        if !system.reset_types.is_empty() && !system.reset_types.iter().any(|t| t == kind.as_str())
        {
            return Err(Error::Unsupported(format!("reset type {}", kind.as_str())));
        }
        let target = system
            .reset_target
            .clone()
            .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", system.odata_id));
        self.action(&target, &json!({ "ResetType": kind.as_str() }))
            .await
    }

    /// `PATCH` `Boot` (with `If-Match` when the BMC gave an ETag); `Error::Unsupported`
    /// when `allowed_targets` is known and lacks the target.
    pub async fn set_boot_override(&self, system: &System, o: &BootOverride) -> Result<(), Error> {
        let allowed = &system.boot.allowed_targets;
        if !allowed.is_empty() && !allowed.iter().any(|t| t == o.target.as_str()) {
            return Err(Error::Unsupported(format!(
                "boot target {} (allowed: {})",
                o.target.as_str(),
                allowed.join(", ")
            )));
        }
        let mut boot = json!({
            "BootSourceOverrideTarget": o.target.as_str(),
            "BootSourceOverrideEnabled": if o.once { "Once" } else { "Continuous" },
        });
        if let Some(uri) = &o.http_boot_uri {
            boot["HttpBootUri"] = json!(uri);
        }
        if let Some(mode) = &o.mode {
            boot["BootSourceOverrideMode"] = json!(mode);
        }
        self.patch(
            &system.odata_id,
            system.etag.as_deref(),
            &json!({ "Boot": boot }),
        )
        .await
    }

    /// The virtual media devices of a system (its own collection, else its managers').
    pub async fn virtual_media(&self, system: &System) -> Result<Vec<VirtualMedia>, Error> {
        let mut collections = Vec::new();
        if let Some(c) = &system.virtual_media {
            collections.push(c.clone());
        } else {
            for m in &system.managers {
                if let Some(c) = self.manager(m).await?.virtual_media {
                    collections.push(c);
                }
            }
        }
        if collections.is_empty() {
            return Err(Error::Unsupported("virtual media".into()));
        }
        let mut out = Vec::new();
        for c in collections {
            let (v, _) = self.get(&c).await?;
            for id in parse::members(&v)? {
                let (v, etag) = self.get(&id).await?;
                out.push(parse::virtual_media(&v, &id, etag));
            }
        }
        Ok(out)
    }

    /// The host NICs the BMC reports for `system` (empty when it has no
    /// `EthernetInterfaces`), at most [`MAX_NICS`].
    pub async fn ethernet_interfaces(
        &self,
        system: &System,
    ) -> Result<Vec<EthernetInterface>, Error> {
        let Some(c) = &system.ethernet_interfaces else {
            return Ok(Vec::new());
        };
        let (v, _) = self.get(c).await?;
        // Read side by side (the per-BMC limit applies), in the collection's order.
        let reads = parse::members(&v)?
            .into_iter()
            .take(MAX_NICS)
            .map(|id| async move {
                let (v, _) = self.get(&id).await?;
                Ok::<_, Error>(parse::ethernet_interface(&v))
            });
        futures::future::try_join_all(reads).await
    }

    /// `InsertMedia` (Inserted, WriteProtected) `image` into `vm`.
    pub async fn insert_media(&self, vm: &VirtualMedia, image: &str) -> Result<(), Error> {
        let body = json!({ "Image": image, "Inserted": true, "WriteProtected": true });
        match &vm.insert_target {
            Some(target) => self.action(target, &body).await,
            None => self.patch(&vm.odata_id, vm.etag.as_deref(), &body).await,
        }
    }

    pub async fn eject_media(&self, vm: &VirtualMedia) -> Result<(), Error> {
        match &vm.eject_target {
            Some(target) => self.action(target, &json!({})).await,
            None => {
                let body = json!({ "Image": null, "Inserted": false });
                self.patch(&vm.odata_id, vm.etag.as_deref(), &body).await
            }
        }
    }

    /// The counters of this BMC (the same as `Pool::stats(base_url)`).
    pub fn stats(&self) -> BmcStats {
        let c = self
            .inner
            .shared
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        BmcStats {
            requests: c.requests,
            max_in_flight: c.max_in_flight,
        }
    }

    /// `GET` a resource: its JSON and its ETag (header; `@odata.etag` is read by the
    /// parsers).
    async fn get(&self, path: &str) -> Result<(Value, Option<String>), Error> {
        let resp = self
            .call(&Req {
                method: Method::GET,
                path,
                body: None,
                if_match: None,
            })
            .await?;
        let v = serde_json::from_slice(&resp.body)
            .map_err(|e| Error::Malformed(format!("{path}: {e}")))?;
        Ok((v, resp.etag))
    }

    /// `PATCH` with `If-Match` (when an ETag is known); a `412`/`428` re-reads the
    /// resource for its current ETag and tries once more.
    async fn patch(&self, path: &str, etag: Option<&str>, body: &Value) -> Result<(), Error> {
        let req = Req {
            method: Method::PATCH,
            path,
            body: Some(body),
            if_match: etag,
        };
        match self.call(&req).await {
            Ok(resp) => self.follow(resp).await,
            Err(Error::Status {
                status: 412 | 428, ..
            }) => {
                let (v, header) = self.get(path).await?;
                let fresh = header.or_else(|| {
                    v.get("@odata.etag")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                let Some(fresh) = fresh else {
                    return Err(Error::Unsupported(format!(
                        "an etag for {path} (it asks for If-Match)"
                    )));
                };
                let req = Req {
                    if_match: Some(&fresh),
                    ..req
                };
                let resp = self.call(&req).await?;
                self.follow(resp).await
            }
            Err(e) => Err(e),
        }
    }

    /// `POST` an action and follow its task monitor, if any.
    async fn action(&self, target: &str, body: &Value) -> Result<(), Error> {
        let req = Req {
            method: Method::POST,
            path: target,
            body: Some(body),
            if_match: None,
        };
        let resp = self.call(&req).await?;
        self.follow(resp).await
    }

    /// A `202` with `Location` is a task monitor: poll it until the task ends or
    /// `task_timeout` passes; any other success is done.
    async fn follow(&self, resp: Resp) -> Result<(), Error> {
        let (202, Some(monitor)) = (resp.status, resp.location) else {
            return Ok(());
        };
        let limit = self.inner.pool.settings.task_timeout;
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(100);
        loop {
            let req = Req {
                method: Method::GET,
                path: &monitor,
                body: None,
                if_match: None,
            };
            let resp = self.call(&req).await?;
            let progress = if resp.status == 202 {
                TaskProgress::Running
            } else if resp.body.is_empty() {
                TaskProgress::Done
            } else {
                let v: Value = serde_json::from_slice(&resp.body)
                    .map_err(|e| Error::Malformed(format!("task monitor: {e}")))?;
                parse::task(&v)
            };
            match progress {
                TaskProgress::Done => return Ok(()),
                TaskProgress::Failed(why) => return Err(Error::TaskFailed(self.scrub(&why))),
                TaskProgress::Running => {}
            }
            let wait = resp
                .retry_after
                .unwrap_or(pause)
                .min(Duration::from_secs(5));
            if Instant::now() + wait > deadline {
                return Err(Error::Timeout(limit));
            }
            tokio::time::sleep(wait).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// One request with credentials and retries; a `401` on a cached session token
    /// drops the token and tries once more with a new session.
    async fn call(&self, req: &Req<'_>) -> Result<Resp, Error> {
        let mut renewed = false;
        loop {
            let auth = self.auth().await?;
            match self.send_retrying(req, &auth).await {
                Err(Error::Unauthorized(401)) if auth.is_token() && !renewed => {
                    self.forget(&auth).await;
                    renewed = true;
                }
                Err(e @ Error::Unauthorized(_)) if !auth.is_token() => {
                    // Basic credentials refused: they count, and are discovered again.
                    self.forget(&auth).await;
                    self.budget(|b, c, s| b.refused(c, s.auth_interval, Instant::now()));
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    /// The credentials for this BMC and username: cached, else discovered (service
    /// root with basic auth; a session when it has a session service).
    async fn auth(&self) -> Result<Auth, Error> {
        let t = &self.inner.target;
        let mut cache = self.inner.shared.auth.lock().await;
        if let Some(a) = cache
            .get(&t.username)
            .filter(|a| a.password_is(&t.password))
        {
            return Ok(a.clone());
        }
        self.budget(|b, c, s| b.check(c, s.auth_attempts, s.auth_interval, Instant::now()))?;
        let found = self.discover_auth().await;
        match &found {
            Ok(_) => self.budget(|b, c, _| b.accepted(c)),
            Err(Error::Unauthorized(_)) => {
                self.budget(|b, c, s| b.refused(c, s.auth_interval, Instant::now()))
            }
            Err(_) => {}
        }
        let auth = found?;
        cache.insert(t.username.clone(), auth.clone());
        Ok(auth)
    }

    /// Runs `f` on this BMC's auth budget for the target's credentials.
    fn budget<R>(&self, f: impl FnOnce(&mut AuthBudget, u64, &Settings) -> R) -> R {
        use std::hash::{Hash, Hasher};
        let t = &self.inner.target;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&t.username, &t.password.0).hash(&mut h);
        let mut b = self
            .inner
            .shared
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f(&mut b, h.finish(), &self.inner.pool.settings)
    }

    /// Service root with basic auth, then a session when the BMC has a session service.
    async fn discover_auth(&self) -> Result<Auth, Error> {
        let t = &self.inner.target;
        let basic = Auth::basic(&t.username, &t.password);
        let root = self
            .send_retrying(
                &Req {
                    method: Method::GET,
                    path: ROOT,
                    body: None,
                    if_match: None,
                },
                &basic,
            )
            .await?;
        let root: Value = serde_json::from_slice(&root.body)
            .map_err(|e| Error::Malformed(format!("service root: {e}")))?;
        let auth = match parse::service_root(&root).session_service {
            None => basic,
            Some(service) => {
                let sessions = parse::sessions_link(&root)
                    .unwrap_or_else(|| format!("{}/Sessions", service.trim_end_matches('/')));
                self.login(&sessions, basic).await?
            }
        };
        Ok(auth)
    }

    /// `POST` the sessions collection; basic auth when the BMC says it has none after
    /// all (404/405/501).
    async fn login(&self, sessions: &str, basic: Auth) -> Result<Auth, Error> {
        let t = &self.inner.target;
        let body = json!({ "UserName": t.username, "Password": t.password.0 });
        let req = Req {
            method: Method::POST,
            path: sessions,
            body: Some(&body),
            if_match: None,
        };
        match self.send_retrying(&req, &Auth::None).await {
            Ok(resp) => match resp.token {
                Some(token) => Ok(Auth::token(token, &t.password)),
                None => Err(Error::Malformed(
                    "session created without X-Auth-Token".into(),
                )),
            },
            Err(Error::Status {
                status: 404 | 405 | 501,
                ..
            }) => Ok(basic),
            Err(e) => Err(e),
        }
    }

    async fn forget(&self, stale: &Auth) {
        let mut cache = self.inner.shared.auth.lock().await;
        if cache.get(&self.inner.target.username) == Some(stale) {
            cache.remove(&self.inner.target.username);
        }
    }

    /// Attempts up to `settings.attempts`, sleeping a fully jittered exponential
    /// backoff (or the BMC's `Retry-After`, capped at `backoff_max`) between them.
    async fn send_retrying(&self, req: &Req<'_>, auth: &Auth) -> Result<Resp, Error> {
        let s = &self.inner.pool.settings;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let f = match transport::send(self.line(), req, auth).await {
                Ok(resp) => return Ok(resp),
                Err(f) => f,
            };
            let Failure {
                error,
                retryable,
                retry_after,
            } = f;
            let error = self.scrub_error(error, auth);
            if !retryable || attempt >= s.attempts.max(1) {
                return Err(error);
            }
            let wait = match retry_after {
                Some(r) => r.min(s.backoff_max),
                None => transport::backoff(s, attempt),
            };
            tracing::debug!(bmc = %self.inner.target.base_url, path = req.path, attempt, ?wait, %error, "redfish request retried");
            tokio::time::sleep(wait).await;
        }
    }

    fn scrub(&self, s: &str) -> String {
        transport::scrub(s, &[self.inner.target.password.0.as_str()])
    }

    fn scrub_error(&self, e: Error, auth: &Auth) -> Error {
        let secrets = [self.inner.target.password.0.as_str(), auth.secret()];
        let s = |m: String| transport::scrub(&m, &secrets);
        match e {
            Error::Unreachable(m) => Error::Unreachable(s(m)),
            Error::Tls(m) => Error::Tls(s(m)),
            Error::Status { status, message } => Error::Status {
                status,
                message: s(message),
            },
            Error::Malformed(m) => Error::Malformed(s(m)),
            Error::Unsupported(m) => Error::Unsupported(s(m)),
            Error::TaskFailed(m) => Error::TaskFailed(s(m)),
            e @ (Error::Timeout(_) | Error::Unauthorized(_) | Error::AuthThrottled { .. }) => e,
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn refused_attempts_throttle_until_the_interval_passes_or_credentials_change() {
        let (t0, iv) = (Instant::now(), Duration::from_secs(300));
        let mut b = AuthBudget::default();
        for i in 0..3 {
            b.check(1, 3, iv, t0).unwrap();
            b.refused(1, iv, t0 + Duration::from_secs(i));
        }
        let e = b.check(1, 3, iv, t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!(
            e,
            Error::AuthThrottled {
                attempts: 3,
                retry_in_secs: 290
            }
        );
        assert!(e.to_string().contains("next attempt in 290s"), "{e}");
        assert_eq!(e.reason(), "CredentialsRefused");
        // The first refusal ages out: one more attempt.
        b.check(1, 3, iv, t0 + Duration::from_secs(300)).unwrap();
        // New credentials: a new budget.
        b.refused(1, iv, t0 + Duration::from_secs(301));
        b.check(2, 3, iv, t0 + Duration::from_secs(301)).unwrap();
        b.refused(2, iv, t0 + Duration::from_secs(301));
        b.accepted(2);
        b.check(2, 1, iv, t0 + Duration::from_secs(302)).unwrap();
    }
}
