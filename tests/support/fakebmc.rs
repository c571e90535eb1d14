//! An in-process fake Redfish service (axum on a real loopback socket) for the client
//! tests and the power benchmark: N systems behind one manager, an optional session
//! service, scripted faults (a status n times, slow answers, malformed or oversized
//! JSON), `If-Match` required on PATCH (`428` without, `412` when stale), reset actions
//! answered through a `202` task monitor, and server-side counters: requests per path,
//! and the most requests it ever had in flight at once.
//!
//! Self-contained (benches include it with `#[path]`): it needs only a tokio runtime.
//!
//! ```ignore
//! let bmc = FakeBmc::builder().systems(4).sessions(true).start().await;
//! bmc.push_fault(None, Fault::Status(503), 2);
//! ```

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// What a scripted fault does to a request instead of answering it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status (with a Redfish error body).
    Status(u16),
    /// Answer this status with this `error.message`.
    StatusMessage(u16, String),
    /// Answer this status with `Retry-After: secs`.
    StatusRetryAfter(u16, u64),
    /// `200` with a body that is not JSON.
    Malformed,
    /// `200` with a 2 MiB JSON body.
    Huge,
    /// Answer normally after this long.
    Slow(Duration),
}

/// How a scripted task ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    Completed,
    /// `TaskState: Exception` with this message.
    Exception(String),
}

/// One system's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysState {
    pub power: String,
    pub boot_target: String,
    pub boot_enabled: String,
    pub boot_mode: String,
    pub http_boot_uri: Option<String>,
    pub media_image: Option<String>,
    pub media_inserted: bool,
    /// Bumped by every change (the ETag is `W/"<version>"`).
    pub version: u64,
    /// Every `ResetType` it was sent, in order.
    pub resets: Vec<String>,
    /// A power change not yet applied (see [`Builder::power_delay`]): when, and to what.
    pub pending: Option<(std::time::Instant, String)>,
}

struct Scripted {
    path: Option<String>,
    fault: Fault,
    times: u32,
}

struct Task {
    polls_left: u32,
    end: TaskEnd,
    /// Applied when the task completes: (system index, reset type).
    apply: (usize, String),
}

struct Inner {
    username: String,
    password: String,
    sessions: bool,
    session_refusal: Option<u16>,
    etag_required: bool,
    media_actions: bool,
    ignore_graceful: bool,
    task: Option<(u32, TaskEnd)>,
    power_delay: Duration,
    boot_targets: Vec<String>,
    systems: Mutex<Vec<SysState>>,
    tokens: Mutex<Vec<String>>,
    faults: Mutex<Vec<Scripted>>,
    tasks: Mutex<HashMap<u64, Task>>,
    delay: Mutex<Duration>,
    per_path: Mutex<HashMap<String, u64>>,
    total: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    sessions_created: AtomicU64,
    next_id: AtomicU64,
    /// Every Authorization / X-Auth-Token / body it was sent (to check what the
    /// client puts where).
    last_auth: Mutex<Option<String>>,
    seed: u16,
    /// Systems left out of the `Systems` collection (gone from the BMC).
    hidden: Mutex<std::collections::HashSet<usize>>,
}

/// Builds a [`FakeBmc`].
pub struct Builder {
    systems: usize,
    username: String,
    password: String,
    sessions: bool,
    session_refusal: Option<u16>,
    etag_required: bool,
    media_actions: bool,
    ignore_graceful: bool,
    task: Option<(u32, TaskEnd)>,
    power_delay: Duration,
    boot_targets: Vec<String>,
    delay: Duration,
    listeners: usize,
    seed: u16,
    bind: String,
}

impl Builder {
    /// Listen on `addr` (default `127.0.0.1:0`), e.g. `0.0.0.0:8000` from a thread in a
    /// test's namespace, for a BMC at the address its DHCP lease gave it.
    pub fn bind(mut self, addr: &str) -> Self {
        self.bind = addr.to_string();
        self
    }
    /// Serve the same BMC on `n` loopback ports (each a different `base_url` to a
    /// client, so one server sees several "BMCs" at once: the global limit test).
    pub fn listeners(mut self, n: usize) -> Self {
        self.listeners = n.max(1);
        self
    }
    pub fn systems(mut self, n: usize) -> Self {
        self.systems = n;
        self
    }
    pub fn credentials(mut self, user: &str, password: &str) -> Self {
        self.username = user.into();
        self.password = password.into();
        self
    }
    /// Serve `SessionService` and `POST .../Sessions` (`X-Auth-Token`).
    pub fn sessions(mut self, on: bool) -> Self {
        self.sessions = on;
        self
    }
    /// Advertise a session service but answer session creation with this status.
    pub fn session_refusal(mut self, status: u16) -> Self {
        self.sessions = true;
        self.session_refusal = Some(status);
        self
    }
    /// PATCH without `If-Match` answers `428`, with a stale one `412`.
    pub fn etag_required(mut self, on: bool) -> Self {
        self.etag_required = on;
        self
    }
    /// Offer `#VirtualMedia.InsertMedia`/`EjectMedia` (else only PATCH of Image/Inserted).
    pub fn media_actions(mut self, on: bool) -> Self {
        self.media_actions = on;
        self
    }
    /// Resets answer `202` + a task monitor that says `Running` `polls` times, then ends.
    pub fn tasks(mut self, polls: u32, end: TaskEnd) -> Self {
        self.task = Some((polls, end));
        self
    }
    /// Resets take effect this long after they are accepted (`PoweringOn`/`PoweringOff`
    /// meanwhile), like real BMCs and sushy's fake driver.
    pub fn power_delay(mut self, d: Duration) -> Self {
        self.power_delay = d;
        self
    }
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`.
    pub fn boot_targets(mut self, targets: &[&str]) -> Self {
        self.boot_targets = targets.iter().map(|s| s.to_string()).collect();
        self
    }
    /// `GracefulShutdown` is recorded but leaves the system On (an OS that ignores the
    /// ACPI power button).
    pub fn ignore_graceful(mut self, on: bool) -> Self {
        self.ignore_graceful = on;
        self
    }
    /// Distinguishes this BMC's systems from other fake BMCs' (UUIDs, NIC MACs): see
    /// [`uuid_for`] and [`mac_for`].
    pub fn seed(mut self, seed: u16) -> Self {
        self.seed = seed;
        self
    }
    /// Every answer waits this long.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// Bind `127.0.0.1:0` and serve on the current tokio runtime until dropped.
    pub async fn start(self) -> FakeBmc {
        let sys = SysState {
            power: "Off".into(),
            boot_target: "None".into(),
            boot_enabled: "Disabled".into(),
            boot_mode: "UEFI".into(),
            http_boot_uri: None,
            media_image: None,
            media_inserted: false,
            resets: Vec::new(),
            version: 1,
            pending: None,
        };
        let inner = Arc::new(Inner {
            username: self.username,
            password: self.password,
            sessions: self.sessions,
            session_refusal: self.session_refusal,
            etag_required: self.etag_required,
            media_actions: self.media_actions,
            ignore_graceful: self.ignore_graceful,
            task: self.task,
            power_delay: self.power_delay,
            boot_targets: self.boot_targets,
            systems: Mutex::new(vec![sys; self.systems]),
            tokens: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            tasks: Mutex::new(HashMap::new()),
            delay: Mutex::new(self.delay),
            per_path: Mutex::new(HashMap::new()),
            total: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            sessions_created: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            last_auth: Mutex::new(None),
            seed: self.seed,
            hidden: Mutex::new(std::collections::HashSet::new()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let mut base_urls = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..self.listeners {
            let listener = tokio::net::TcpListener::bind(self.bind.as_str())
                .await
                .expect("bind fake bmc");
            base_urls.push(format!("http://{}", listener.local_addr().unwrap()));
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
        }
        FakeBmc {
            base_url: base_urls[0].clone(),
            base_urls,
            inner,
            tasks,
        }
    }
}

/// A running fake BMC; stops when dropped.
pub struct FakeBmc {
    /// `http://127.0.0.1:PORT` (the first listener).
    pub base_url: String,
    /// Every listener's URL (see [`Builder::listeners`]).
    pub base_urls: Vec<String>,
    inner: Arc<Inner>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeBmc {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The UUID of system `i` (upper case, so lookups must ignore case).
pub fn uuid_of(i: usize) -> String {
    uuid_for(0, i)
}

/// The UUID of system `i` of the fake BMC built with [`Builder::seed`] `seed`.
pub fn uuid_for(seed: u16, i: usize) -> String {
    format!("5A2C{seed:04X}-0000-4000-8000-{i:012X}")
}

/// The MAC of NIC `n` (0 or 1) of system `i` of the fake BMC with seed `seed`.
pub fn mac_for(seed: u16, i: usize, n: usize) -> String {
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        seed >> 8,
        seed & 0xff,
        (i >> 8) & 0xff,
        i & 0xff,
        n
    )
}

impl FakeBmc {
    pub fn builder() -> Builder {
        Builder {
            systems: 1,
            username: "admin".into(),
            password: "password".into(),
            sessions: false,
            session_refusal: None,
            etag_required: false,
            media_actions: true,
            task: None,
            power_delay: Duration::ZERO,
            boot_targets: ["None", "Pxe", "Cd", "Hdd", "UefiHttp"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            delay: Duration::ZERO,
            listeners: 1,
            ignore_graceful: false,
            seed: 0,
            bind: "127.0.0.1:0".into(),
        }
    }
    /// `@odata.id` of system `i` (0-based).
    pub fn system_path(&self, i: usize) -> String {
        format!("/redfish/v1/Systems/{}", i + 1)
    }
    /// Requests seen on `path` (any method).
    pub fn requests(&self, path: &str) -> u64 {
        self.inner
            .per_path
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }
    /// Leave system `i` out of the `Systems` collection (`false`), or put it back.
    pub fn set_present(&self, i: usize, present: bool) {
        let mut h = self.inner.hidden.lock().unwrap();
        if present {
            h.remove(&i);
        } else {
            h.insert(i);
        }
    }
    pub fn total_requests(&self) -> u64 {
        self.inner.total.load(Ordering::SeqCst)
    }
    /// The most requests it had in flight at once.
    pub fn max_concurrent(&self) -> u64 {
        self.inner.max_in_flight.load(Ordering::SeqCst)
    }
    pub fn sessions_created(&self) -> u64 {
        self.inner.sessions_created.load(Ordering::SeqCst)
    }
    /// Invalidate every session token (the next request with one gets `401`).
    pub fn expire_sessions(&self) {
        self.inner.tokens.lock().unwrap().clear();
    }
    pub fn state(&self, i: usize) -> SysState {
        let mut systems = self.inner.systems.lock().unwrap();
        settle(&mut systems[i]);
        systems[i].clone()
    }
    /// How many systems are `On` now.
    pub fn powered_on(&self) -> usize {
        let mut systems = self.inner.systems.lock().unwrap();
        systems
            .iter_mut()
            .map(settle)
            .filter(|s| s.power == "On")
            .count()
    }
    /// Change a system behind the client's back (e.g. its power state).
    pub fn set_power(&self, i: usize, power: &str) {
        let mut s = self.inner.systems.lock().unwrap();
        s[i].power = power.into();
        s[i].version += 1;
    }
    pub fn set_delay(&self, d: Duration) {
        *self.inner.delay.lock().unwrap() = d;
    }
    /// Drop every scripted fault still pending.
    pub fn clear_faults(&self) {
        self.inner.faults.lock().unwrap().clear();
    }
    /// The next `times` requests on `path` (every path when `None`) get `fault`.
    pub fn push_fault(&self, path: Option<&str>, fault: Fault, times: u32) {
        self.inner.faults.lock().unwrap().push(Scripted {
            path: path.map(str::to_owned),
            fault,
            times,
        });
    }
    /// The last credentials header it was sent (`Basic ...` or `Token ...`).
    pub fn last_auth(&self) -> Option<String> {
        self.inner.last_auth.lock().unwrap().clone()
    }
}

/// Decrements the in-flight count when the request ends (also when cancelled).
struct Flight<'a>(&'a Inner);

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(
    State(st): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    st.total.fetch_add(1, Ordering::SeqCst);
    *st.per_path.lock().unwrap().entry(path.clone()).or_default() += 1;
    let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    st.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _flight = Flight(&st);

    let delay = *st.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let fault = take_fault(&st, &path);
    match fault {
        Some(Fault::Status(s)) => return error(s, "scripted fault"),
        Some(Fault::StatusMessage(s, m)) => return error(s, &m),
        Some(Fault::StatusRetryAfter(s, secs)) => {
            let mut r = error(s, "scripted fault");
            r.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
            return r;
        }
        Some(Fault::Malformed) => {
            return (
                StatusCode::OK,
                [("content-type", "application/json")],
                "{\"Id\": ",
            )
                .into_response()
        }
        Some(Fault::Huge) => {
            let big = json!({ "Id": "x", "Pad": "a".repeat(2 << 20) }).to_string();
            return (StatusCode::OK, [("content-type", "application/json")], big).into_response();
        }
        Some(Fault::Slow(d)) => tokio::time::sleep(d).await,
        None => {}
    }
    route(&st, &method, &path, &headers, &body)
}

fn take_fault(st: &Inner, path: &str) -> Option<Fault> {
    let mut faults = st.faults.lock().unwrap();
    let f = faults
        .iter_mut()
        .find(|f| f.times > 0 && f.path.as_deref().is_none_or(|p| p == path))?;
    f.times -= 1;
    Some(f.fault.clone())
}

fn error(status: u16, message: &str) -> Response {
    let body = json!({ "error": { "code": "Base.1.0.GeneralError", "message": message } });
    let status = StatusCode::from_u16(status).unwrap();
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok_json(v: Value, etag: Option<String>) -> Response {
    let mut r = (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response();
    if let Some(tag) = etag {
        r.headers_mut()
            .insert("etag", HeaderValue::from_str(&tag).unwrap());
    }
    r
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// Basic with the right pair, or a live session token.
fn authorized(st: &Inner, headers: &HeaderMap) -> bool {
    use base64::Engine as _;
    if let Some(tok) = headers.get("x-auth-token").and_then(|v| v.to_str().ok()) {
        *st.last_auth.lock().unwrap() = Some(format!("Token {tok}"));
        return st.tokens.lock().unwrap().iter().any(|t| t == tok);
    }
    let Some(basic) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    *st.last_auth.lock().unwrap() = Some(basic.to_owned());
    let Some(b64) = basic.strip_prefix("Basic ") else {
        return false;
    };
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return false;
    };
    raw == format!("{}:{}", st.username, st.password).into_bytes()
}

fn route(st: &Inner, method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let p = path.trim_end_matches('/');
    if p == "/redfish/v1" && method == Method::GET {
        return ok_json(root(st), None);
    }
    if p == "/redfish/v1/SessionService/Sessions" && method == Method::POST && st.sessions {
        return login(st, body);
    }
    if !authorized(st, headers) {
        return error(401, "authentication required");
    }
    let parts: Vec<&str> = p.split('/').skip(3).collect();
    let json_body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let n = st.systems.lock().unwrap().len();
    let sys_index = |id: &str| {
        id.parse::<usize>()
            .ok()
            .filter(|i| (1..=n).contains(i))
            .map(|i| i - 1)
    };
    match (method.clone(), parts.as_slice()) {
        (Method::GET, ["Systems"]) => {
            let hidden = st.hidden.lock().unwrap().clone();
            ok_json(
                collection(
                    "/redfish/v1/Systems",
                    (1..=n)
                        .filter(|i| !hidden.contains(&(i - 1)))
                        .map(|i| format!("/redfish/v1/Systems/{i}")),
                ),
                None,
            )
        }
        (Method::GET, ["Systems", id, "EthernetInterfaces"]) => match sys_index(id) {
            Some(i) => ok_json(
                collection(
                    &format!("/redfish/v1/Systems/{}/EthernetInterfaces", i + 1),
                    (0..2).map(|n| format!("/redfish/v1/Systems/{}/EthernetInterfaces/{n}", i + 1)),
                ),
                None,
            ),
            None => error(404, "no such system"),
        },
        (Method::GET, ["Systems", id, "EthernetInterfaces", nic]) => {
            match (sys_index(id), nic.parse::<usize>().ok().filter(|n| *n < 2)) {
                (Some(i), Some(nic)) => ok_json(
                    json!({ "@odata.id": p, "Id": nic.to_string(), "MACAddress": mac_for(st.seed, i, nic),
                            "LinkStatus": if nic == 0 { "LinkUp" } else { "LinkDown" } }),
                    None,
                ),
                _ => error(404, "no such interface"),
            }
        }
        (Method::GET, ["Systems", id]) => match sys_index(id) {
            Some(i) => {
                let s = settle(&mut st.systems.lock().unwrap()[i]).clone();
                ok_json(system(st, i, &s), Some(etag(&s)))
            }
            None => error(404, "no such system"),
        },
        (Method::PATCH, ["Systems", id]) => match sys_index(id) {
            Some(i) => patch_system(st, i, headers, &json_body),
            None => error(404, "no such system"),
        },
        // Each system's own media collection holds its own device (as blade BMCs and
        // sushy-tools do); the manager's lists them all.
        (Method::GET, ["Systems", id, "VirtualMedia"]) => match sys_index(id) {
            Some(i) => ok_json(
                collection(
                    &format!("/redfish/v1/Systems/{}/VirtualMedia", i + 1),
                    std::iter::once(format!("/redfish/v1/Managers/BMC/VirtualMedia/Cd{}", i + 1)),
                ),
                None,
            ),
            None => error(404, "no such system"),
        },
        (Method::POST, ["Systems", id, "Actions", "ComputerSystem.Reset"]) => match sys_index(id) {
            Some(i) => reset(st, i, &json_body),
            None => error(404, "no such system"),
        },
        (Method::GET, ["Managers", "BMC"]) => ok_json(
            json!({ "@odata.id": "/redfish/v1/Managers/BMC", "Id": "BMC", "FirmwareVersion": "1.2.3",
                    "Manufacturer": "Fake", "Model": "FakeBMC",
                    "VirtualMedia": { "@odata.id": "/redfish/v1/Managers/BMC/VirtualMedia" } }),
            None,
        ),
        (Method::GET, ["Managers", "BMC", "VirtualMedia"]) => ok_json(
            collection(
                "/redfish/v1/Managers/BMC/VirtualMedia",
                (1..=n).map(|i| format!("/redfish/v1/Managers/BMC/VirtualMedia/Cd{i}")),
            ),
            None,
        ),
        (m, ["Managers", "BMC", "VirtualMedia", dev, rest @ ..]) => {
            match dev.strip_prefix("Cd").and_then(sys_index) {
                Some(i) => media(st, i, m, rest, headers, &json_body),
                None => error(404, "no such device"),
            }
        }
        (Method::GET, ["TaskMonitors", id]) => task_monitor(st, id),
        _ => error(405, "not here"),
    }
}

fn root(st: &Inner) -> Value {
    let mut v = json!({
        "@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.11.0",
        "UUID": "00000000-0000-0000-0000-00000000F00D", "Vendor": "Fake", "Product": "FakeBMC",
        "Systems": { "@odata.id": "/redfish/v1/Systems" },
        "Managers": { "@odata.id": "/redfish/v1/Managers" },
    });
    if st.sessions {
        v["SessionService"] = json!({ "@odata.id": "/redfish/v1/SessionService" });
        v["Links"] = json!({ "Sessions": { "@odata.id": "/redfish/v1/SessionService/Sessions" } });
    }
    v
}

fn login(st: &Inner, body: &[u8]) -> Response {
    if let Some(s) = st.session_refusal {
        return error(s, "sessions are not supported");
    }
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if v["UserName"] != st.username.as_str() || v["Password"] != st.password.as_str() {
        return error(401, "bad credentials");
    }
    let n = st.sessions_created.fetch_add(1, Ordering::SeqCst) + 1;
    let token = format!("tok{n}x{}", st.next_id.fetch_add(1, Ordering::SeqCst));
    st.tokens.lock().unwrap().push(token.clone());
    let mut r = (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        json!({ "Id": n.to_string() }).to_string(),
    )
        .into_response();
    r.headers_mut()
        .insert("x-auth-token", HeaderValue::from_str(&token).unwrap());
    r.headers_mut().insert(
        "location",
        HeaderValue::from_str(&format!("/redfish/v1/SessionService/Sessions/{n}")).unwrap(),
    );
    r
}

fn collection(id: &str, members: impl Iterator<Item = String>) -> Value {
    let members: Vec<Value> = members.map(|m| json!({ "@odata.id": m })).collect();
    json!({ "@odata.id": id, "Members@odata.count": members.len(), "Members": members })
}

fn etag(s: &SysState) -> String {
    format!("W/\"{}\"", s.version)
}

fn system(st: &Inner, i: usize, s: &SysState) -> Value {
    let id = i + 1;
    json!({
        "@odata.id": format!("/redfish/v1/Systems/{id}"), "@odata.etag": etag(s), "Id": id.to_string(),
        "UUID": uuid_for(st.seed, i), "Manufacturer": "Fake", "Model": "Fake-1", "SerialNumber": format!("SN{id:05}"),
        "BiosVersion": "F.1", "PowerState": s.power,
        "Boot": {
            "BootSourceOverrideTarget": s.boot_target, "BootSourceOverrideEnabled": s.boot_enabled,
            "BootSourceOverrideMode": s.boot_mode, "HttpBootUri": s.http_boot_uri,
            "BootSourceOverrideTarget@Redfish.AllowableValues": st.boot_targets,
        },
        "Actions": { "#ComputerSystem.Reset": {
            "target": format!("/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"],
        } },
        "Links": { "ManagedBy": [{ "@odata.id": "/redfish/v1/Managers/BMC" }] },
        "VirtualMedia": { "@odata.id": format!("/redfish/v1/Systems/{id}/VirtualMedia") },
        "EthernetInterfaces": { "@odata.id": format!("/redfish/v1/Systems/{id}/EthernetInterfaces") },
    })
}

/// `None` when the ETag rules pass, else the `428`/`412` answer.
fn etag_check(st: &Inner, s: &SysState, headers: &HeaderMap) -> Option<Response> {
    if !st.etag_required {
        return None;
    }
    match headers.get("if-match").and_then(|v| v.to_str().ok()) {
        None => Some(error(428, "If-Match required")),
        Some(t) if t != etag(s) => Some(error(412, "stale ETag")),
        Some(_) => None,
    }
}

fn patch_system(st: &Inner, i: usize, headers: &HeaderMap, v: &Value) -> Response {
    let mut systems = st.systems.lock().unwrap();
    let s = &mut systems[i];
    if let Some(r) = etag_check(st, s, headers) {
        return r;
    }
    let boot = &v["Boot"];
    if let Some(t) = boot["BootSourceOverrideTarget"].as_str() {
        if !st.boot_targets.iter().any(|a| a == t) {
            return error(400, "unsupported boot target");
        }
        s.boot_target = t.into();
    }
    if let Some(e) = boot["BootSourceOverrideEnabled"].as_str() {
        s.boot_enabled = e.into();
    }
    if let Some(m) = boot["BootSourceOverrideMode"].as_str() {
        s.boot_mode = m.into();
    }
    if let Some(u) = boot["HttpBootUri"].as_str() {
        s.http_boot_uri = Some(u.into());
    }
    s.version += 1;
    no_content()
}

/// Apply a pending power change that is due.
fn settle(s: &mut SysState) -> &mut SysState {
    if let Some((at, to)) = s.pending.take() {
        if std::time::Instant::now() >= at {
            s.power = to;
            s.version += 1;
        } else {
            s.pending = Some((at, to));
        }
    }
    s
}

fn apply_reset(st: &Inner, s: &mut SysState, kind: &str) {
    s.resets.push(kind.to_string());
    if kind == "GracefulShutdown" && st.ignore_graceful {
        s.version += 1;
        return;
    }
    let to = match kind {
        "ForceOff" | "GracefulShutdown" => "Off",
        _ => "On",
    };
    if st.power_delay.is_zero() {
        s.power = to.into();
    } else {
        s.power = if to == "On" {
            "PoweringOn"
        } else {
            "PoweringOff"
        }
        .into();
        s.pending = Some((std::time::Instant::now() + st.power_delay, to.into()));
    }
    s.version += 1;
}

fn reset(st: &Inner, i: usize, v: &Value) -> Response {
    let Some(kind) = v["ResetType"].as_str() else {
        return error(400, "ResetType missing");
    };
    let Some((polls, end)) = st.task.clone() else {
        apply_reset(st, &mut st.systems.lock().unwrap()[i], kind);
        return no_content();
    };
    let id = st.next_id.fetch_add(1, Ordering::SeqCst);
    st.tasks.lock().unwrap().insert(
        id,
        Task {
            polls_left: polls,
            end,
            apply: (i, kind.into()),
        },
    );
    let mut r = (
        StatusCode::ACCEPTED,
        [("content-type", "application/json")],
        json!({ "TaskState": "New" }).to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        "location",
        HeaderValue::from_str(&format!("/redfish/v1/TaskMonitors/{id}")).unwrap(),
    );
    r
}

fn task_monitor(st: &Inner, id: &str) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return error(404, "no such task");
    };
    let mut tasks = st.tasks.lock().unwrap();
    let Some(t) = tasks.get_mut(&id) else {
        return error(404, "no such task");
    };
    if t.polls_left > 0 {
        t.polls_left -= 1;
        let body = json!({ "TaskState": "Running", "PercentComplete": 50 }).to_string();
        return (
            StatusCode::ACCEPTED,
            [("content-type", "application/json")],
            body,
        )
            .into_response();
    }
    let body = match &t.end {
        TaskEnd::Completed => {
            let (i, kind) = t.apply.clone();
            apply_reset(st, &mut st.systems.lock().unwrap()[i], &kind);
            json!({ "TaskState": "Completed", "TaskStatus": "OK" })
        }
        TaskEnd::Exception(m) => {
            json!({ "TaskState": "Exception", "TaskStatus": "Critical", "Messages": [{ "Message": m }] })
        }
    };
    ok_json(body, None)
}

fn media(
    st: &Inner,
    i: usize,
    m: Method,
    rest: &[&str],
    headers: &HeaderMap,
    v: &Value,
) -> Response {
    let mut systems = st.systems.lock().unwrap();
    let s = &mut systems[i];
    let id = format!("/redfish/v1/Managers/BMC/VirtualMedia/Cd{}", i + 1);
    match (m, rest) {
        (Method::GET, []) => {
            let mut body = json!({
                "@odata.id": id, "Id": format!("Cd{}", i + 1), "MediaTypes": ["CD", "DVD"],
                "Image": s.media_image, "Inserted": s.media_inserted, "@odata.etag": etag(s),
            });
            if st.media_actions {
                body["Actions"] = json!({
                    "#VirtualMedia.InsertMedia": { "target": format!("{id}/Actions/VirtualMedia.InsertMedia") },
                    "#VirtualMedia.EjectMedia": { "target": format!("{id}/Actions/VirtualMedia.EjectMedia") },
                });
            }
            ok_json(body, None)
        }
        (Method::PATCH, []) => {
            if let Some(r) = etag_check(st, s, headers) {
                return r;
            }
            s.media_image = v["Image"].as_str().map(str::to_owned);
            s.media_inserted = v["Inserted"].as_bool().unwrap_or(s.media_image.is_some());
            s.version += 1;
            no_content()
        }
        (Method::POST, ["Actions", "VirtualMedia.InsertMedia"]) if st.media_actions => {
            let Some(image) = v["Image"].as_str() else {
                return error(400, "Image missing");
            };
            s.media_image = Some(image.into());
            s.media_inserted = v["Inserted"].as_bool().unwrap_or(true);
            s.version += 1;
            no_content()
        }
        (Method::POST, ["Actions", "VirtualMedia.EjectMedia"]) if st.media_actions => {
            s.media_image = None;
            s.media_inserted = false;
            s.version += 1;
            no_content()
        }
        _ => error(405, "not here"),
    }
}
