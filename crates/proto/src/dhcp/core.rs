//! The pure DHCP core: `request + meta + state → outcome`, no sockets, no clock,
//! no files. The socket loop decodes, calls [`Server::handle`], makes the lease
//! journal durable, then sends.
//!
//! Boot logic (RFC 4578, PXE 2.1, UEFI HTTP Boot, iPXE):
//! - a client is a *boot client* when option 60 starts with `PXEClient` or
//!   `HTTPClient`, or it is iPXE (user class 77 `iPXE`, or option 175 present);
//! - iPXE gets the HTTP URL of `/boot.ipxe` (breaks the chainload loop), and, on the MAC
//!   of a known machine with signed URLs on, a script token for that machine's current
//!   boot in option [`SCRIPT_TOKEN_OPTION`] (`boot.ipxe` sends it on, [`MachineScripts`]);
//!   others get the file mapped from their architecture (option 93): TFTP name with siaddr,
//!   `file`, options 66/67; HTTP Boot a URL with option 60 `HTTPClient`;
//! - PXE replies carry option 60 `PXEClient`, echo option 97, and option 43 with PXE
//!   discovery control = 8 (boot from this reply) in authoritative replies to PXE
//!   firmware and in BIOS proxy replies (UEFI asks on port 4011 in proxy mode);
//! - authoritative replies to iPXE carry 175.176 = 1 so iPXE skips waiting for proxyDHCP;
//! - proxy mode answers boot clients only, with `yiaddr = 0`: DISCOVER on port 67 gets
//!   a proxy OFFER, REQUEST/INFORM on port 4011 (UEFI PXE, iPXE) a proxy ACK unicast back.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{
    self, DhcpOption, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};

use super::leases::{AllocError, LeaseTable};
use super::members::View;
use super::metrics::DropReason;
pub use super::overload::MIN_MESSAGE_LEN;
use super::settings::{BootTarget, DhcpMode, DhcpSettings, Reservation};
use crate::model::ident::Mac;

pub(crate) const SERVER_PORT: u16 = 67;
pub(crate) const CLIENT_PORT: u16 = 68;
pub(crate) const PXE_PORT: u16 = 4011;

/// Seconds a declined address stays parked.
const DECLINE_HOLD_SECS: u64 = 600;

/// Facts about one received packet that are not in the packet.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    /// Unix seconds.
    pub now: u64,
    /// Sender's address and port.
    pub src: SocketAddrV4,
    /// Our port it arrived on (67 or 4011).
    pub local_port: u16,
}

/// What a reply is, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    Offer,
    Ack,
    Nak,
    Inform,
    ProxyOffer,
    ProxyAck,
}

/// A reply and where to send it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub msg: Message,
    pub dest: SocketAddrV4,
    /// `dest` is the limited broadcast address.
    pub broadcast: bool,
    pub kind: ReplyKind,
    /// The largest DHCP message the client accepts ([`max_reply_len`]); [`encode_reply`]
    /// moves options into `file`/`sname` (option 52) to stay within it.
    pub max_len: usize,
}

/// The result of handling one packet.
#[derive(Debug)]
pub enum Outcome {
    Reply(Reply),
    /// Processed, nothing to send (RELEASE, DECLINE, REQUEST for another server).
    Silent,
    Drop(DropReason),
}

impl Outcome {
    pub fn reply(self) -> Option<Reply> {
        match self {
            Outcome::Reply(r) => Some(r),
            _ => None,
        }
    }
}

/// What the firmware told us about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub pxe: bool,
    pub http: bool,
    pub ipxe: bool,
    pub arch: Option<u16>,
}

impl ClientInfo {
    pub(crate) fn of(req: &Message) -> ClientInfo {
        let opts = req.opts();
        let class = match opts.get(OptionCode::ClassIdentifier) {
            Some(DhcpOption::ClassIdentifier(v)) => v.as_slice(),
            _ => &[],
        };
        let user_class_ipxe = match opts.get(OptionCode::UserClass) {
            Some(DhcpOption::UserClass(v)) => v.windows(4).any(|w| w == b"iPXE"),
            _ => false,
        };
        let arch = match opts.get(OptionCode::ClientSystemArchitecture) {
            Some(DhcpOption::ClientSystemArchitecture(a)) => Some(a.0),
            _ => None,
        };
        ClientInfo {
            pxe: class.starts_with(b"PXEClient"),
            http: class.starts_with(b"HTTPClient"),
            ipxe: user_class_ipxe || opts.contains(OptionCode::Unknown(175)),
            arch,
        }
    }

    pub(crate) fn is_boot_client(&self) -> bool {
        self.pxe || self.http || self.ipxe
    }
}

/// The boot answer chosen for a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootChoice {
    pub file: String,
    /// Via TFTP from `next_server`; false = HTTP URL.
    pub tftp: bool,
}

/// Per-machine script tokens for iPXE (`http.sign_ignition_urls`): given the client's
/// MAC, the address the reply gives it (`yiaddr`, else its `ciaddr`; `None` in a proxy
/// offer) and the time (unix seconds), a token for the script of the machine holding
/// that MAC, minted for its current boot and bound to that address, or `None` (no such
/// machine, or signed URLs off). `serve` builds it over the boot listener, so this layer
/// does not depend on that one.
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct MachineScripts(
    pub std::sync::Arc<dyn Fn(Mac, Option<Ipv4Addr>, u64) -> Option<String> + Send + Sync>,
);

impl std::fmt::Debug for MachineScripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MachineScripts")
    }
}

/// The DHCP option (site-specific range) that carries a known machine's script token to
/// its iPXE; `boot.ipxe` sends it on as `&token=${224:uristring}`.
pub const SCRIPT_TOKEN_OPTION: u8 = 224;

/// The DHCP server state: settings, our address and the lease table.
#[derive(Debug)]
pub struct Server {
    /// Everything but the subnets and reservations, which the table owns (empty here).
    pub settings: DhcpSettings,
    pub server_ip: Ipv4Addr,
    pub table: LeaseTable,
    /// Per-machine script tokens for iPXE clients ([`Server::with_machine_scripts`]).
    machine_scripts: Option<MachineScripts>,
    /// The appliances sharing the scope (leases in etcd): who answers which client
    /// ([`super::members`]); `None`: this server answers everyone.
    members: Option<View>,
}

/// The address reply `m` to `req` leaves the client at: the one it leases (`yiaddr`),
/// else the one the client has (`ciaddr`, an INFORM or a port-4011 request); `None` in a
/// proxy offer, where another server gives the address.
fn leased_to(m: &Message, req: &Message) -> Option<Ipv4Addr> {
    [m.yiaddr(), req.ciaddr()]
        .into_iter()
        .find(|a| !a.is_unspecified())
}

fn mac_of(req: &Message) -> Option<Mac> {
    // chaddr() slices by hlen, which comes from the wire: check before calling it.
    if req.htype() != HType::Eth || req.hlen() != 6 {
        return None;
    }
    let c = req.chaddr();
    let mut m = [0u8; 6];
    m.copy_from_slice(c.get(..6)?);
    Some(m)
}

fn requested_ip(req: &Message) -> Option<Ipv4Addr> {
    match req.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    }
}

fn server_id(req: &Message) -> Option<Ipv4Addr> {
    match req.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    }
}

/// Option 12, without control characters (an escape sequence in it would reach the
/// operator's terminal through `get leases`), at most 63 characters; `None` when nothing
/// is left.
fn hostname(req: &Message) -> Option<String> {
    match req.opts().get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) => {
            let h: String = h.chars().filter(|c| !c.is_control()).take(63).collect();
            (!h.is_empty()).then_some(h)
        }
        _ => None,
    }
}

impl Server {
    pub fn new(mut settings: DhcpSettings, server_ip: Ipv4Addr) -> Server {
        let table = LeaseTable::new(
            std::mem::take(&mut settings.subnets),
            std::mem::take(&mut settings.reservations),
        );
        Server {
            settings,
            server_ip,
            table,
            machine_scripts: None,
            members: None,
        }
    }

    /// The appliances sharing this scope as they are now ([`super::members`]).
    pub(crate) fn set_members(&mut self, view: View) {
        self.members = Some(view);
    }

    /// This server answers `mac`'s DISCOVER and INIT-REBOOT: it owns the client among
    /// the live members, or serves alone.
    fn owns(&self, mac: &Mac) -> bool {
        self.members.as_ref().is_none_or(|v| v.mine(mac))
    }

    /// Give iPXE on a known machine's MAC a script token for that machine
    /// ([`SCRIPT_TOKEN_OPTION`]); every other client's reply is unchanged.
    pub(crate) fn with_machine_scripts(mut self, m: MachineScripts) -> Server {
        self.machine_scripts = Some(m);
        self
    }

    /// Replace static reservations (hook for registered Servers' MACs).
    pub(crate) fn set_reservations(&mut self, list: Vec<Reservation>) {
        self.table.set_reservations(list);
    }

    /// Which boot file this client gets, if any.
    pub(crate) fn boot_choice(&self, c: &ClientInfo) -> Option<BootChoice> {
        if c.ipxe {
            return Some(BootChoice {
                file: self.settings.boot.script_url.clone(),
                tftp: false,
            });
        }
        let arch = c.arch.unwrap_or(if c.http { 16 } else { 0 });
        match self.settings.boot.by_arch.get(&arch)? {
            BootTarget::Tftp(f) if c.pxe => Some(BootChoice {
                file: f.clone(),
                tftp: true,
            }),
            BootTarget::Http(u) if c.http => Some(BootChoice {
                file: u.clone(),
                tftp: false,
            }),
            _ => None,
        }
    }

    fn next_server(&self) -> Ipv4Addr {
        self.settings.boot.tftp_server.unwrap_or(self.server_ip)
    }

    /// Handle one decoded request.
    pub fn handle(&mut self, req: &Message, meta: &Meta) -> Outcome {
        let mut out = self.handle_request_kind(req, meta);
        if let Outcome::Reply(r) = &mut out {
            r.max_len = max_reply_len(req);
        }
        out
    }

    fn handle_request_kind(&mut self, req: &Message, meta: &Meta) -> Outcome {
        if req.opcode() != Opcode::BootRequest {
            return Outcome::Drop(DropReason::NotRequest);
        }
        let Some(mac) = mac_of(req) else {
            return Outcome::Drop(DropReason::NotRequest);
        };
        let Some(mtype) = req.opts().msg_type() else {
            return Outcome::Drop(DropReason::Malformed);
        };
        let client = ClientInfo::of(req);
        if meta.local_port == PXE_PORT {
            return self.handle_pxe_port(req, meta, &client, mtype);
        }
        let mut out = match self.settings.mode {
            DhcpMode::Proxy => self.handle_proxy(req, &client, mtype, meta.now),
            DhcpMode::Authoritative => self.handle_authoritative(req, meta, mac, &client, mtype),
        };
        // A relay that sent from a port other than 67 (RFC 8357 style, or a load tool
        // acting as relay) gets the reply on that port.
        if let Outcome::Reply(r) = &mut out {
            let gi = req.giaddr();
            if !gi.is_unspecified() && *meta.src.ip() == gi && r.dest.ip() == &gi {
                r.dest.set_port(meta.src.port());
            }
        }
        out
    }

    // ---- proxy mode ----------------------------------------------------------

    fn handle_proxy(
        &mut self,
        req: &Message,
        client: &ClientInfo,
        mtype: MessageType,
        now: u64,
    ) -> Outcome {
        if mtype != MessageType::Discover || !client.is_boot_client() {
            return Outcome::Drop(DropReason::Ignored);
        }
        let Some(boot) = self.boot_choice(client) else {
            return Outcome::Drop(DropReason::Ignored);
        };
        let mut m = self.base_reply(req, MessageType::Offer);
        self.add_boot(&mut m, (req, client, now), &boot, true);
        let (dest, broadcast) = self.dest_for(req, None, false);
        Outcome::Reply(Reply {
            msg: m,
            dest,
            broadcast,
            kind: ReplyKind::ProxyOffer,
            max_len: MIN_MESSAGE_LEN,
        })
    }

    /// Port 4011: a boot client that already has an address asks for its boot file.
    fn handle_pxe_port(
        &mut self,
        req: &Message,
        meta: &Meta,
        client: &ClientInfo,
        mtype: MessageType,
    ) -> Outcome {
        if !matches!(mtype, MessageType::Request | MessageType::Inform) || !client.is_boot_client()
        {
            return Outcome::Drop(DropReason::Ignored);
        }
        let Some(boot) = self.boot_choice(client) else {
            return Outcome::Drop(DropReason::Ignored);
        };
        let mut m = self.base_reply(req, MessageType::Ack);
        m.set_ciaddr(req.ciaddr());
        self.add_boot(
            &mut m,
            (req, client, meta.now),
            &boot,
            self.settings.mode == DhcpMode::Proxy,
        );
        Outcome::Reply(Reply {
            msg: m,
            dest: meta.src,
            broadcast: false,
            kind: ReplyKind::ProxyAck,
            max_len: MIN_MESSAGE_LEN,
        })
    }

    // ---- authoritative mode --------------------------------------------------

    fn subnet_for(&self, req: &Message) -> Option<usize> {
        let gi = req.giaddr();
        if !gi.is_unspecified() {
            return self.table.subnet_index_for(gi);
        }
        let ci = req.ciaddr();
        if !ci.is_unspecified() {
            if let Some(i) = self.table.subnet_index_for(ci) {
                return Some(i);
            }
        }
        self.table
            .subnet_index_for(self.server_ip)
            .or(if self.table.subnets().len() == 1 {
                Some(0)
            } else {
                None
            })
    }

    fn handle_authoritative(
        &mut self,
        req: &Message,
        meta: &Meta,
        mac: Mac,
        client: &ClientInfo,
        mtype: MessageType,
    ) -> Outcome {
        let now = meta.now;
        match mtype {
            MessageType::Discover => {
                if !self.owns(&mac) {
                    return Outcome::Drop(DropReason::OtherMember);
                }
                let Some(si) = self.subnet_for(req) else {
                    return Outcome::Drop(DropReason::NoSubnet);
                };
                let ip = match self.table.choose(si, &mac, requested_ip(req), now) {
                    Ok(ip) => ip,
                    Err(AllocError::NoSubnet) => return Outcome::Drop(DropReason::NoSubnet),
                    Err(AllocError::PoolExhausted) => {
                        return Outcome::Drop(DropReason::PoolExhausted)
                    }
                };
                let host = self.host_for(req, &mac);
                self.table.offer(
                    ip,
                    mac,
                    host,
                    now + u64::from(self.settings.offer_hold_secs),
                );
                let mut m = self.base_reply(req, MessageType::Offer);
                m.set_yiaddr(ip);
                self.add_lease_opts(&mut m, si, true);
                if let Some(b) = self.boot_choice(client) {
                    self.add_boot(&mut m, (req, client, now), &b, false);
                }
                let (dest, broadcast) = self.dest_for(req, None, false);
                Outcome::Reply(Reply {
                    msg: m,
                    dest,
                    broadcast,
                    kind: ReplyKind::Offer,
                    max_len: MIN_MESSAGE_LEN,
                })
            }
            MessageType::Request => self.handle_request(req, meta, mac, client),
            MessageType::Release => {
                if server_id(req).is_some_and(|s| s != self.server_ip) {
                    return Outcome::Drop(DropReason::Ignored);
                }
                if self.table.release(req.ciaddr(), &mac, now) {
                    Outcome::Silent
                } else {
                    Outcome::Drop(DropReason::Ignored)
                }
            }
            MessageType::Decline => {
                if server_id(req).is_some_and(|s| s != self.server_ip) {
                    return Outcome::Drop(DropReason::Ignored);
                }
                match requested_ip(req) {
                    Some(ip) if self.table.decline(ip, &mac, now + DECLINE_HOLD_SECS) => {
                        Outcome::Silent
                    }
                    _ => Outcome::Drop(DropReason::Ignored),
                }
            }
            MessageType::Inform => {
                let ci = req.ciaddr();
                let Some(si) = self.subnet_for(req) else {
                    return Outcome::Drop(DropReason::NoSubnet);
                };
                let mut m = self.base_reply(req, MessageType::Ack);
                m.set_ciaddr(ci);
                self.add_lease_opts(&mut m, si, false);
                self.ack_reply(m, (req, client, now), ReplyKind::Inform)
            }
            _ => Outcome::Drop(DropReason::Ignored),
        }
    }

    fn host_for(&self, req: &Message, mac: &Mac) -> Option<String> {
        self.table
            .reservation(mac)
            .and_then(|r| r.hostname.clone())
            .or_else(|| hostname(req))
    }

    fn handle_request(
        &mut self,
        req: &Message,
        meta: &Meta,
        mac: Mac,
        client: &ClientInfo,
    ) -> Outcome {
        let now = meta.now;
        let sid = server_id(req);
        let ci = req.ciaddr();
        // The identifier the answer carries: ours, or a dead member's we stand in for.
        let mut answer_as = self.server_ip;
        match sid {
            Some(s) if s != self.server_ip => {
                if !self
                    .members
                    .as_ref()
                    .is_some_and(|v| v.stands_in_for(s, &mac))
                {
                    // The client chose another server: drop our offer.
                    self.table.cancel_offer(&mac);
                    return Outcome::Drop(DropReason::Ignored);
                }
                answer_as = s;
            }
            // INIT-REBOOT: the client's owner answers it (renewals and rebinds, with
            // `ciaddr`, are answered by whoever hears them).
            None if ci.is_unspecified() && !self.owns(&mac) => {
                return Outcome::Drop(DropReason::OtherMember);
            }
            _ => {}
        }
        let wanted = match requested_ip(req) {
            Some(ip) => ip,
            None if !ci.is_unspecified() => ci,
            None => return Outcome::Drop(DropReason::Malformed),
        };
        let si = match self.subnet_for(req) {
            Some(si) => si,
            None => return Outcome::Drop(DropReason::NoSubnet),
        };
        let reserved_elsewhere = self
            .table
            .reservation(&mac)
            .is_some_and(|r| r.ip != wanted && self.table.subnets()[si].contains(r.ip));
        let ok = !reserved_elsewhere
            && self.table.subnets()[si].contains(wanted)
            && self.can_have(si, wanted, &mac, now);
        if !ok {
            if sid.is_none()
                && ci.is_unspecified()
                && !self.table.subnets()[si].contains(wanted)
                && !req.giaddr().is_unspecified()
            {
                // INIT-REBOOT from a network we do not serve behind a relay: stay silent.
                return Outcome::Drop(DropReason::Ignored);
            }
            let mut m = self.base_reply(req, MessageType::Nak);
            m.opts_mut().insert(DhcpOption::ServerIdentifier(answer_as));
            m.opts_mut().insert(DhcpOption::Message(
                "requested address not available".into(),
            ));
            let (dest, broadcast) = self.dest_for(req, None, true);
            return Outcome::Reply(Reply {
                msg: m,
                dest,
                broadcast,
                kind: ReplyKind::Nak,
                max_len: MIN_MESSAGE_LEN,
            });
        }
        let lease_time = self.table.subnets()[si].lease_time_secs;
        let host = self.host_for(req, &mac);
        self.table
            .bind(wanted, mac, host, now + u64::from(lease_time));
        let mut m = self.base_reply(req, MessageType::Ack);
        m.opts_mut().insert(DhcpOption::ServerIdentifier(answer_as));
        m.set_yiaddr(wanted);
        m.set_ciaddr(ci);
        self.add_lease_opts(&mut m, si, true);
        self.ack_reply(m, (req, client, now), ReplyKind::Ack)
    }

    /// The end of an ACK (or the ACK answering an INFORM) `m`: the client's boot options
    /// added, sent to the `ciaddr` of `req` when it has one.
    fn ack_reply(
        &self,
        mut m: Message,
        (req, client, now): (&Message, &ClientInfo, u64),
        kind: ReplyKind,
    ) -> Outcome {
        if let Some(b) = self.boot_choice(client) {
            self.add_boot(&mut m, (req, client, now), &b, false);
        }
        let ci = req.ciaddr();
        let unicast = (!ci.is_unspecified()).then_some(ci);
        let (dest, broadcast) = self.dest_for(req, unicast, false);
        Outcome::Reply(Reply {
            msg: m,
            dest,
            broadcast,
            kind,
            max_len: MIN_MESSAGE_LEN,
        })
    }

    fn can_have(&mut self, si: usize, ip: Ipv4Addr, mac: &Mac, now: u64) -> bool {
        // choose() returns `ip` itself when it is available to this client
        // (reservation, own lease, or requested and free).
        matches!(self.table.choose(si, mac, Some(ip), now), Ok(got) if got == ip)
    }

    /// The NAK that replaces `ack` when its lease could not be granted after all
    /// (another appliance holds the address: [`super::cluster`]); the client starts over.
    pub(crate) fn nak_for(&self, ack: &Reply) -> Reply {
        let a = &ack.msg;
        let mut m = Message::default();
        m.set_opcode(Opcode::BootReply)
            .set_htype(a.htype())
            .set_xid(a.xid())
            .set_flags(a.flags())
            .set_giaddr(a.giaddr())
            .set_chaddr(a.chaddr());
        let o = m.opts_mut();
        o.insert(DhcpOption::MessageType(MessageType::Nak));
        // The ACK's identifier: ours, or the dead member's it stood in for.
        let sid = match a.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => *s,
            _ => self.server_ip,
        };
        o.insert(DhcpOption::ServerIdentifier(sid));
        o.insert(DhcpOption::Message(
            "address taken by another server".into(),
        ));
        if let Some(ra) = a.opts().get(OptionCode::RelayAgentInformation) {
            o.insert(ra.clone());
        }
        // RFC 2131 4.3.2: a NAK goes to the relay, else broadcast.
        let (dest, broadcast) = if a.giaddr().is_unspecified() {
            (SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT), true)
        } else {
            (ack.dest, false)
        };
        Reply {
            msg: m,
            dest,
            broadcast,
            kind: ReplyKind::Nak,
            max_len: MIN_MESSAGE_LEN,
        }
    }

    // ---- reply building ------------------------------------------------------

    fn base_reply(&self, req: &Message, mtype: MessageType) -> Message {
        let mut m = Message::default();
        m.set_opcode(Opcode::BootReply)
            .set_htype(req.htype())
            .set_xid(req.xid())
            .set_flags(req.flags())
            .set_giaddr(req.giaddr())
            .set_chaddr(req.chaddr());
        let o = m.opts_mut();
        o.insert(DhcpOption::MessageType(mtype));
        o.insert(DhcpOption::ServerIdentifier(self.server_ip));
        if let Some(ra) = req.opts().get(OptionCode::RelayAgentInformation) {
            o.insert(ra.clone());
        }
        m
    }

    fn add_lease_opts(&self, m: &mut Message, si: usize, with_lease: bool) {
        let s = &self.table.subnets()[si];
        let o = m.opts_mut();
        o.insert(DhcpOption::SubnetMask(s.mask()));
        o.insert(DhcpOption::BroadcastAddr(s.broadcast()));
        if let Some(r) = s.router {
            o.insert(DhcpOption::Router(vec![r]));
        }
        if !s.dns.is_empty() {
            o.insert(DhcpOption::DomainNameServer(s.dns.clone()));
        }
        if let Some(d) = &s.domain {
            o.insert(DhcpOption::DomainName(d.clone()));
        }
        if with_lease {
            let t = s.lease_time_secs;
            o.insert(DhcpOption::AddressLeaseTime(t));
            o.insert(DhcpOption::Renewal(t / 2));
            o.insert(DhcpOption::Rebinding(t / 8 * 7));
        }
    }

    /// The boot options of `client`'s reply `m` to `req`, at `now` (unix seconds: a
    /// machine's script token is minted then).
    fn add_boot(
        &self,
        m: &mut Message,
        (req, client, now): (&Message, &ClientInfo, u64),
        boot: &BootChoice,
        proxy: bool,
    ) {
        let next = self.next_server();
        let leased = leased_to(m, req);
        m.set_siaddr(next);
        if boot.file.len() < 128 {
            m.set_fname_str(&boot.file);
        }
        let o = m.opts_mut();
        o.insert(DhcpOption::BootfileName(boot.file.as_bytes().to_vec()));
        if boot.tftp {
            o.insert(DhcpOption::TFTPServerName(next.to_string().into_bytes()));
        }
        if client.http && !client.ipxe {
            o.insert(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
        } else if client.pxe {
            o.insert(DhcpOption::ClassIdentifier(b"PXEClient".to_vec()));
        }
        if let Some(DhcpOption::ClientMachineIdentifier(id)) =
            req.opts().get(OptionCode::ClientMachineIdentifier)
        {
            o.insert(DhcpOption::ClientMachineIdentifier(id.clone()));
        }
        // PXE_DISCOVERY_CONTROL (6) = 8: boot from the file in this reply, no discovery.
        // Proxy: BIOS only (UEFI asks on port 4011). Authoritative: every PXE firmware,
        // because EDK2 (OVMF) takes a `PXEClient` offer without option 43 for a BINL
        // offer and asks port 4011, which an authoritative server does not open: the
        // boot then fails with "PXE-E16: No valid offer received" (seen with OVMF).
        let pxe_firmware = client.pxe && !client.ipxe;
        if pxe_firmware && (!proxy || client.arch.unwrap_or(0) == 0) {
            o.insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
        }
        if client.ipxe {
            // A known machine's script token, for `boot.ipxe` to send on.
            let token = self
                .machine_scripts
                .as_ref()
                .zip(mac_of(req))
                .and_then(|(f, mac)| (f.0)(mac, leased, now))
                .filter(|t| t.len() <= 255);
            if let Some(t) = token {
                o.insert(DhcpOption::Unknown(UnknownOption::new(
                    OptionCode::Unknown(SCRIPT_TOKEN_OPTION),
                    t.into_bytes(),
                )));
            }
        }
        if !proxy && client.ipxe {
            // iPXE encapsulated option 176 (no-pxedhcp) = 1: do not wait for proxyDHCP.
            o.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::Unknown(175),
                vec![176, 1, 1],
            )));
        }
    }

    /// RFC 2131 4.1: relay → giaddr; NAK → broadcast; ciaddr → unicast; else broadcast.
    fn dest_for(
        &self,
        req: &Message,
        unicast: Option<Ipv4Addr>,
        nak: bool,
    ) -> (SocketAddrV4, bool) {
        let gi = req.giaddr();
        if !gi.is_unspecified() {
            return (SocketAddrV4::new(gi, SERVER_PORT), false);
        }
        match unicast {
            Some(ip) if !nak => (SocketAddrV4::new(ip, CLIENT_PORT), false),
            _ => (SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT), true),
        }
    }
}

/// `ack` with its lease time (option 51) lowered to `secs`, and T1/T2 (58/59) with
/// it: a renewal granted only up to what the lease already had ([`super::cluster`]).
pub(crate) fn shorten_lease(ack: &mut Reply, secs: u32) {
    let o = ack.msg.opts_mut();
    o.insert(DhcpOption::AddressLeaseTime(secs));
    o.insert(DhcpOption::Renewal(secs / 2));
    o.insert(DhcpOption::Rebinding(secs / 8 * 7));
}

/// Walk the option TLVs and refuse shapes that make dhcproto 0.15 assert or
/// underflow (found by the fuzz target): wrong lengths for options it reads with
/// fixed sizes (80, 81, 93, 94, 151-155), those options repeated (dhcproto joins
/// repeats, RFC 3396, and then asserts on the joined length), options running
/// past the packet, or no magic cookie.
fn prevalidate(buf: &[u8]) -> bool {
    const MAGIC: [u8; 4] = [99, 130, 83, 99];
    if buf.len() < 240 || buf[236..240] != MAGIC || buf[2] > 16 {
        return false;
    }
    let mut seen = [false; 256];
    let mut i = 240;
    while i < buf.len() {
        let code = buf[i];
        match code {
            0 => {
                i += 1;
                continue;
            }
            255 => return true,
            _ => {}
        }
        let Some(&l) = buf.get(i + 1) else {
            return false;
        };
        let l = usize::from(l);
        if i + 2 + l > buf.len() {
            return false;
        }
        let ok = match code {
            80 => l == 0,
            81 => l >= 3,
            93 => l >= 2,
            94 => l == 3,
            151 => l >= 1,
            152..=155 => l == 4,
            _ => true,
        };
        let fixed = matches!(code, 80 | 81 | 93 | 94 | 151..=155);
        if !ok || (fixed && seen[usize::from(code)]) {
            return false;
        }
        seen[usize::from(code)] = true;
        i += 2 + l;
    }
    true
}

/// Decode a packet; `None` if it is not valid DHCPv4. Never panics: shapes known
/// to trip dhcproto are refused first, and a panic inside the decoder is caught.
pub fn decode(buf: &[u8]) -> Option<Message> {
    use dhcproto::Decodable;
    // Options the client moved into `file`/`sname` (option 52) join the others.
    let buf = &*super::overload::unfold(buf);
    if !prevalidate(buf) {
        return None;
    }
    let m = std::panic::catch_unwind(|| v4::Message::decode(&mut dhcproto::Decoder::new(buf)).ok())
        .ok()??;
    if m.hlen() > 16 {
        return None;
    }
    Some(m)
}

/// Encode a message as it is (no size limit).
pub fn encode(m: &Message) -> Option<Vec<u8>> {
    use dhcproto::Encodable;
    m.to_vec().ok()
}

/// Encode a reply within the client's size limit (`r.max_len`), overloading `file` /
/// `sname` when needed; the second value counts options that fit nowhere.
pub(crate) fn encode_reply(r: &Reply) -> Option<(Vec<u8>, usize)> {
    let f = super::overload::fit(encode(&r.msg)?, r.max_len);
    Some((f.bytes, f.dropped))
}

/// The largest reply `req`'s sender accepts (option 57, RFC 2132 9.10; see
/// [`super::overload::max_len_for`]).
pub(crate) fn max_reply_len(req: &Message) -> usize {
    let v = match req.opts().get(OptionCode::MaxMessageSize) {
        Some(DhcpOption::MaxMessageSize(n)) => Some(*n),
        _ => None,
    };
    super::overload::max_len_for(v)
}

#[cfg(test)]
mod member_tests;
#[cfg(test)]
mod tests;
