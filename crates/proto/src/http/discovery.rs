//! The discovery side of the boot listener: the script of a Server in `Discovery` (the
//! discovery image with a signed inventory URL) and `POST /discovery/inventory/<server>
//! [/<token>]`, where the agent (`bootplane probe`) reports the machine's inventory.
//!
//! A report is taken only from the machine itself: its source address is one of the
//! Server's (registered, or leased to one of its MACs), or the URL carries a valid token of
//! purpose `inventory` minted into that Server's discovery script for its current
//! discovery boot. Then, in order: the Server must be in `Discovery` (409), the body must
//! be JSON of the agent's [`Inventory`] shape (400) within [`MAX_INVENTORY_BYTES`] (413,
//! enforced by the connection loop before anything is read), every value must be within
//! bounds and well formed ([`check`], 422), and its system UUID must be the Server's
//! (409). Only then is it queued for the controller that writes the Server's status
//! (202); nothing is written for a refused report, and each outcome is counted
//! (`bootplane_http_discovery_inventory_total`). The checks that need no body (the
//! route, the Server, the address or token, `Discovery`) run before the connection loop
//! reads the body ([`BootHttp::inventory_may_post`]): a post refused by them is answered
//! at once and its body never buffered, so only the machine itself can make the
//! listener hold a body (up to 256 KiB for up to [`BODY_TIMEOUT`]).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::StatusCode;

use super::metrics::{ResultLabels, RouteLabels};
use super::respond::{bad_request, route, text, Resp};
use super::token::Purpose;
use super::BootHttp;
use super::{AgentReport, BootFiles, BootState, MachineBoot, MachineId, Report};
use crate::ipxe::DiscoveryScript;
use crate::model::ident::{parse_mac, parse_uuid};
use crate::model::meta::valid_object_name;
use crate::sys::unix_now;
use bootplane_probe::Inventory;

/// Largest inventory body taken (a 64-NIC, 256-disk, 1,024-CPU report is ~150 KiB).
pub(crate) const MAX_INVENTORY_BYTES: usize = 256 << 10;
/// How long the connection loop waits for a whole inventory body.
pub(crate) const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// The route's path prefix.
pub use super::respond::INVENTORY_PREFIX as PREFIX;

const MAX_NICS: usize = 64;
const MAX_IPS: usize = 32;
const MAX_NEIGHBORS: usize = 16;
const MAX_DISKS: usize = 256;
const MAX_CPUS: usize = 1024;
const MAX_TEXT: usize = 256;
const MAX_NAME: usize = 64;

/// Why [`BootHttp::agent_gate`] refused a post.
pub(super) enum Gate {
    Malformed,
    Unknown,
    Forbidden(Arc<MachineBoot>, String),
}

/// Whether a request with a body to `path` is one whose body may be read (an agent's
/// inventory or wipe report; the connection loop then asks
/// [`BootHttp::agent_may_post`] first).
pub(crate) fn takes_body(method: &http::Method, path: &str) -> bool {
    method == http::Method::POST
        && (path.starts_with(PREFIX)
            || path.starts_with(super::respond::WIPE_PREFIX)
            || path.starts_with(super::respond::INSTALL_PREFIX))
}

/// Why an inventory is refused (the 422's message).
pub fn check(inv: &Inventory) -> Result<(), String> {
    parse_uuid(&inv.system_uuid).map_err(|e| format!("systemUUID: {e}"))?;
    let s = &inv.system;
    for (f, v) in [
        ("system.manufacturer", &s.manufacturer),
        ("system.product", &s.product),
        ("system.serialNumber", &s.serial_number),
        ("system.sku", &s.sku),
        ("system.biosVersion", &s.bios_version),
    ] {
        text_ok(f, v.as_deref(), MAX_TEXT)?;
    }
    count("nics", inv.nics.len(), MAX_NICS)?;
    for (i, n) in inv.nics.iter().enumerate() {
        name_ok(&format!("nics[{i}].name"), &n.name)?;
        parse_mac(&n.mac_address).map_err(|e| format!("nics[{i}].macAddress: {e}"))?;
        count(&format!("nics[{i}].ips"), n.ips.len(), MAX_IPS)?;
        for (j, ip) in n.ips.iter().enumerate() {
            ip.parse::<IpAddr>()
                .map_err(|_| format!("nics[{i}].ips[{j}]: not an IP address"))?;
        }
        count(
            &format!("nics[{i}].neighbors"),
            n.neighbors.len(),
            MAX_NEIGHBORS,
        )?;
        for (j, nb) in n.neighbors.iter().enumerate() {
            if let Some(m) = &nb.mac_address {
                parse_mac(m).map_err(|e| format!("nics[{i}].neighbors[{j}].macAddress: {e}"))?;
            }
            for (f, v) in [
                ("chassisID", &nb.chassis_id),
                ("portID", &nb.port_id),
                ("portDescription", &nb.port_description),
                ("systemName", &nb.system_name),
                ("systemDescription", &nb.system_description),
            ] {
                text_ok(
                    &format!("nics[{i}].neighbors[{j}].{f}"),
                    v.as_deref(),
                    MAX_TEXT,
                )?;
            }
        }
    }
    count("disks", inv.disks.len(), MAX_DISKS)?;
    for (i, d) in inv.disks.iter().enumerate() {
        name_ok(&format!("disks[{i}].name"), &d.name)?;
        for (f, v) in [
            ("model", &d.model),
            ("vendor", &d.vendor),
            ("serial", &d.serial),
            ("transport", &d.transport),
        ] {
            text_ok(&format!("disks[{i}].{f}"), v.as_deref(), MAX_TEXT)?;
        }
    }
    count("cpus", inv.cpus.len(), MAX_CPUS)?;
    for (i, c) in inv.cpus.iter().enumerate() {
        name_ok(&format!("cpus[{i}].id"), &c.id)?;
        for (f, v) in [
            ("manufacturer", &c.manufacturer),
            ("model", &c.model),
            ("architecture", &c.architecture),
        ] {
            text_ok(&format!("cpus[{i}].{f}"), v.as_deref(), MAX_TEXT)?;
        }
    }
    Ok(())
}

fn count(field: &str, n: usize, max: usize) -> Result<(), String> {
    if n > max {
        return Err(format!("{field}: {n} entries, at most {max}"));
    }
    Ok(())
}

fn name_ok(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{field}: must not be empty"));
    }
    text_ok(field, Some(v), MAX_NAME)
}

pub(super) fn text_ok(field: &str, v: Option<&str>, max: usize) -> Result<(), String> {
    let Some(v) = v else { return Ok(()) };
    if v.len() > max {
        return Err(format!("{field}: longer than {max} bytes"));
    }
    if v.chars().any(char::is_control) {
        return Err(format!("{field}: contains a control character"));
    }
    Ok(())
}

/// One of the agents' report routes: what its token is for, its route label and its
/// outcome counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AgentRoute {
    Inventory,
    Wipe,
    Install,
}

impl AgentRoute {
    fn purpose(self) -> Purpose {
        match self {
            AgentRoute::Inventory => Purpose::Inventory,
            AgentRoute::Wipe => Purpose::Wipe,
            AgentRoute::Install => Purpose::Install,
        }
    }

    fn label(self) -> &'static str {
        match self {
            AgentRoute::Inventory => route::INVENTORY,
            AgentRoute::Wipe => route::WIPE,
            AgentRoute::Install => route::INSTALL,
        }
    }
}

impl BootHttp {
    /// The discovery script of `m` (a Server in `Discovery` booting `files`), with a fresh
    /// signed inventory URL.
    pub(super) fn discovery_script(
        &self,
        m: &MachineBoot,
        files: &BootFiles,
    ) -> Result<Bytes, crate::ipxe::RenderError> {
        let token = self.signer.mint(
            Purpose::Inventory,
            &m.server,
            &m.boot_id,
            unix_now(),
            self.token_ttl,
        );
        let url = format!("{}{PREFIX}{}/{}", self.base_url, m.server, token);
        let d = DiscoveryScript {
            server: &m.server,
            image: &files.image,
            kernel_url: &files.kernel_url,
            initrd_url: &files.initrd_url,
            cmdline: &files.cmdline,
            inventory_url: &url,
            lldp_wait: self.lldp_wait_secs,
            console: &self.console,
            base_url: &self.base_url,
        };
        Ok(Bytes::from(self.renderer.discovery_script(&d)?))
    }

    /// Whether a `POST` to `path` (the inventory or wipe route) from `client` passes the
    /// checks that need no body: a well-formed name of a known Server, the machine's own
    /// address or a valid token of the route's purpose, the Server in the route's state
    /// (`Discovery`, `Cleanup`). The connection loop asks before it reads the body, and
    /// answers a refused post without reading it (through the route's handler with an
    /// empty body, which refuses it again, counted and logged). No side effects.
    pub(crate) fn agent_may_post(&self, path: &str, client: IpAddr) -> bool {
        if let Some(rest) = path.strip_prefix(PREFIX) {
            return matches!(self.agent_gate(Purpose::Inventory, rest, client), Ok(m) if m.state == BootState::Discovery);
        }
        if let Some(rest) = path.strip_prefix(super::respond::WIPE_PREFIX) {
            return matches!(self.agent_gate(Purpose::Wipe, rest, client), Ok(m) if matches!(m.state, BootState::Cleanup(_)));
        }
        if let Some(rest) = path.strip_prefix(super::respond::INSTALL_PREFIX) {
            return matches!(self.agent_gate(Purpose::Install, rest, client), Ok(m) if matches!(m.state, BootState::Install(_)));
        }
        false
    }

    /// The identity part of an agent's post: the Server named in `rest` when the post
    /// comes from the machine (its address, or a valid token of `purpose` in `rest`).
    pub(super) fn agent_gate(
        &self,
        purpose: Purpose,
        rest: &str,
        client: IpAddr,
    ) -> Result<Arc<MachineBoot>, Gate> {
        let (name, token) = match rest.split_once('/') {
            Some((n, t)) => (n, Some(t)),
            None => (rest, None),
        };
        if !valid_object_name(name) {
            return Err(Gate::Malformed);
        }
        let Some(m) = self.index.lookup(&MachineId::Server(name.to_string())) else {
            return Err(Gate::Unknown);
        };
        if !self.index.owns(&m, client) {
            let why = match token {
                Some(t) => self
                    .signer
                    .verify(t, purpose, &m.server, &m.boot_id, unix_now())
                    .err()
                    .map(|e| e.to_string()),
                None => Some("source address not the machine's and no token".into()),
            };
            if let Some(why) = why {
                return Err(Gate::Forbidden(m, why));
            }
        }
        Ok(m)
    }

    /// `POST /discovery/inventory/<rest>` with `body`.
    pub(super) fn inventory(
        &self,
        rest: &str,
        body: &Bytes,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let m = match self.admit(AgentRoute::Inventory, rest, client, server_out) {
            Ok(m) => m,
            Err(resp) => return *resp,
        };
        if m.state != BootState::Discovery {
            self.count("conflict");
            return text(
                StatusCode::CONFLICT,
                &format!("server {} is not in Discovery\n", m.server),
            );
        }
        let inv: Inventory = match serde_json::from_slice(body) {
            Ok(i) => i,
            Err(e) => {
                self.count("malformed");
                return bad_request(&format!("inventory: {e}"));
            }
        };
        if let Err(why) = check(&inv) {
            self.count("invalid");
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("inventory: {why}\n"),
            );
        }
        let reported = parse_uuid(&inv.system_uuid).unwrap_or_default();
        if let Some(u) = &m.uuid {
            if *u != reported {
                self.count("conflict");
                tracing::warn!(server = %m.server, client = %client, reported, expected = %u, "inventory of another system refused");
                return text(
                    StatusCode::CONFLICT,
                    &format!(
                        "inventory: systemUUID {reported} is not server {}'s ({u})\n",
                        m.server
                    ),
                );
            }
        }
        // The NICs become identity the boot listener trusts: a report from a leased
        // address must list the MAC that lease was granted to.
        if let Some(mac) = self.index.lease_mac(client) {
            if !inv
                .nics
                .iter()
                .any(|n| parse_mac(&n.mac_address).ok() == Some(mac))
            {
                self.count("invalid");
                tracing::warn!(server = %m.server, client = %client, "inventory without the leased MAC refused");
                return text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "inventory: nics does not list the MAC of the DHCP lease it was sent from\n",
                );
            }
        }
        let report = AgentReport {
            server: m.server.clone(),
            boot_id: m.boot_id.clone(),
            client,
            report: Report::Inventory(inv),
        };
        self.queue(AgentRoute::Inventory, report)
    }

    fn count(&self, result: &'static str) {
        self.count_agent(AgentRoute::Inventory, result);
    }

    /// Count one outcome of agent route `r`.
    pub(super) fn count_agent(&self, r: AgentRoute, result: &'static str) {
        let family = match r {
            AgentRoute::Inventory => &self.metrics.inventory,
            AgentRoute::Wipe => &self.metrics.wipe,
            AgentRoute::Install => &self.metrics.install,
        };
        family.get_or_create(&ResultLabels { result }).inc();
    }

    /// The identity part of a post to agent route `r` (the Server named in `rest`, from
    /// its machine), or the answer refusing it, counted and logged.
    pub(super) fn admit(
        &self,
        r: AgentRoute,
        rest: &str,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Result<Arc<MachineBoot>, Box<Resp>> {
        match self.agent_gate(r.purpose(), rest, client) {
            Ok(m) => {
                *server_out = Some(m.clone());
                Ok(m)
            }
            Err(Gate::Malformed) => {
                self.count_agent(r, "malformed");
                Err(Box::new(bad_request("malformed server name")))
            }
            Err(Gate::Unknown) => {
                self.count_agent(r, "unknown");
                Err(Box::new(text(StatusCode::NOT_FOUND, "no such server\n")))
            }
            Err(Gate::Forbidden(m, why)) => {
                *server_out = Some(m.clone());
                self.count_agent(r, "forbidden");
                let route = r.label();
                self.metrics
                    .identity_refused
                    .get_or_create(&RouteLabels { route })
                    .inc();
                tracing::warn!(server = %m.server, client = %client, route, why, "agent report refused by the identity check");
                Err(Box::new(text(StatusCode::FORBIDDEN, "forbidden\n")))
            }
        }
    }

    /// Hand a checked report of route `r` to the writer: 202, or 503 with `Retry-After`
    /// while its queue is full.
    pub(super) fn queue(&self, r: AgentRoute, report: AgentReport) -> Resp {
        let (server, client) = (report.server.clone(), report.client);
        if !self.index.record_report(report) {
            self.count_agent(r, "busy");
            let mut resp = text(StatusCode::SERVICE_UNAVAILABLE, "busy, retry\n");
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            return resp;
        }
        self.count_agent(r, "accepted");
        tracing::info!(server = %server, client = %client, route = r.label(), "agent report accepted");
        text(StatusCode::ACCEPTED, "accepted\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_probe::{Cpu, Disk, Nic};

    fn good() -> Inventory {
        Inventory {
            system_uuid: "5A2C0000-0000-4000-8000-000000000001".into(),
            nics: vec![Nic {
                name: "eth0".into(),
                mac_address: "52:54:00:00:00:01".into(),
                carrier: true,
                ips: vec!["10.0.0.5".into()],
                ..Nic::default()
            }],
            disks: vec![Disk {
                name: "sda".into(),
                size_bytes: 1 << 30,
                ..Disk::default()
            }],
            cpus: vec![Cpu {
                id: "CPU 0".into(),
                cores: 1,
                threads: 1,
                ..Cpu::default()
            }],
            memory_bytes: 1 << 30,
            ..Inventory::default()
        }
    }

    #[test]
    fn checks_bounds_and_formats() {
        assert_eq!(check(&good()), Ok(()));
        let mut i = good();
        i.system_uuid = "nope".into();
        assert!(check(&i).unwrap_err().starts_with("systemUUID"));
        let mut i = good();
        i.nics[0].mac_address = "zz".into();
        assert!(check(&i).unwrap_err().starts_with("nics[0].macAddress"));
        let mut i = good();
        i.nics[0].ips.push("10.0.0.999".into());
        assert!(check(&i).unwrap_err().starts_with("nics[0].ips[1]"));
        let mut i = good();
        i.disks = vec![i.disks[0].clone(); MAX_DISKS + 1];
        assert!(check(&i).unwrap_err().contains("at most 256"));
        let mut i = good();
        i.cpus[0].model = Some("x\ny".into());
        assert!(check(&i).unwrap_err().contains("control character"));
        let mut i = good();
        i.disks[0].name = String::new();
        assert!(check(&i).unwrap_err().contains("must not be empty"));
        let mut i = good();
        i.system.manufacturer = Some("m".repeat(300));
        assert!(check(&i).unwrap_err().contains("longer than 256"));
    }

    #[test]
    fn only_posts_to_the_route_take_a_body() {
        assert!(takes_body(&http::Method::POST, "/discovery/inventory/s1/t"));
        assert!(!takes_body(&http::Method::PUT, "/discovery/inventory/s1"));
        assert!(!takes_body(&http::Method::POST, "/ipxe/script"));
    }
}
