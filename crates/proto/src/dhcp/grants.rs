//! Granted leases reported to another part of the appliance (the management scope's
//! hook for discovery): each ACK's MAC, address, hostname and vendor class (option 60),
//! handed over on a bounded channel only once its lease is durable. A full channel is
//! counted and the report dropped; the DHCP loop never waits for its reader.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, OptionCode};
use tokio::sync::mpsc;

use super::core::Reply;
use super::metrics::Metrics;
use crate::model::ident::Mac;

/// One granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    /// Option 60, printable ASCII only, at most 64 characters.
    pub vendor_class: Option<String>,
}

/// The reports of a loop: those whose ACKs wait for the next commit, and those whose
/// ACKs wait for the commit being written.
#[derive(Default)]
pub(crate) struct Reporter {
    tx: Option<mpsc::Sender<Grant>>,
    pending: Vec<Grant>,
    inflight: Vec<Grant>,
}

fn text(o: Option<&DhcpOption>) -> Option<String> {
    let bytes: &[u8] = match o? {
        DhcpOption::Hostname(h) => h.as_bytes(),
        DhcpOption::ClassIdentifier(v) => v,
        _ => return None,
    };
    let s: String = bytes
        .iter()
        .take(64)
        .filter(|b| b.is_ascii_graphic() || **b == b' ')
        .map(|b| *b as char)
        .collect();
    (!s.is_empty()).then_some(s)
}

impl Reporter {
    pub(crate) fn new(tx: Option<mpsc::Sender<Grant>>) -> Reporter {
        Reporter {
            tx,
            ..Default::default()
        }
    }

    /// An ACK `reply` to `req` is waiting for its commit.
    pub(crate) fn acked(&mut self, req: &Message, reply: &Reply) {
        if self.tx.is_none() {
            return;
        }
        let ch = reply.msg.chaddr();
        if ch.len() < 6 || reply.msg.yiaddr().is_unspecified() {
            return;
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&ch[..6]);
        self.pending.push(Grant {
            mac,
            ip: reply.msg.yiaddr(),
            hostname: text(req.opts().get(OptionCode::Hostname)),
            vendor_class: text(req.opts().get(OptionCode::ClassIdentifier)),
        });
    }

    /// The pending ACKs went into a commit.
    pub(crate) fn committing(&mut self) {
        self.inflight.append(&mut self.pending);
    }

    /// The commit ended: report its grants whose leases are durable (`durable`).
    pub(crate) fn committed(&mut self, durable: impl Fn(&Grant) -> bool, metrics: &Metrics) {
        let mut done = std::mem::take(&mut self.inflight);
        done.retain(|g| durable(g));
        self.send(done, metrics);
    }

    /// The pending ACKs left without a commit (their leases were already durable).
    pub(crate) fn flush(&mut self, metrics: &Metrics) {
        let done = std::mem::take(&mut self.pending);
        self.send(done, metrics);
    }

    fn send(&self, grants: Vec<Grant>, metrics: &Metrics) {
        let Some(tx) = &self.tx else { return };
        for g in grants {
            if tx.try_send(g).is_err() {
                metrics.reports_dropped.inc();
            }
        }
    }
}
