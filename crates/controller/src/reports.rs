//! The writer of the agents' reports (the boot listener checks identity and shape and
//! queues; this writes, off the request path): inventories ([`super::inventory`]), wipe
//! reports ([`super::cleanup`]) and install reports ([`super::install`]), one at a time,
//! in the order they came.

use tokio::sync::mpsc;

use crate::dhcp::settings::Subnet;
use crate::http::{AgentReport, Report};
use crate::shutdown::Shutdown;
use crate::store::Store;

/// Reports waiting for the writer; beyond it the listener answers 503 and the agent
/// retries.
pub const QUEUE: usize = 1024;

/// Write the agents' reports as they come until shutdown: inventories through
/// [`super::inventory::write`], wipe reports through [`super::cleanup::write`] (each Server's in turn; a failure is logged, the
/// agent is not told: it was already answered 202, and the Server stays in its state to
/// be booted again). Addresses inside `pools`' dynamic ranges are not registered.
pub async fn run(
    store: Store,
    mut rx: mpsc::Receiver<AgentReport>,
    pools: Vec<Subnet>,
    mut shutdown: Shutdown,
) {
    let t_server = store.registry().resolve("server").expect("server type");
    let t_sbc = store.registry().resolve("sbc").expect("sbc type");
    let events = crate::store::events::Recorder::spawn(store.clone(), "bootplane-inventory");
    loop {
        let r = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => return },
            _ = shutdown.recv() => return,
        };
        let written = match &r.report {
            Report::Inventory(inv) => {
                super::inventory::write(&store, &t_server, (&r, inv), &pools, &events).await
            }
            Report::Wipe(w) => super::cleanup::write(&store, &t_server, &r, w, &events).await,
            Report::Install(i) => {
                let v = super::install::verdict(i, r.client);
                super::install::write(&store, (&t_server, &t_sbc), &r, &v, &events).await
            }
        };
        if let Err(e) = written {
            tracing::warn!(server = %r.server, error = %e, "writing an agent's report");
        }
    }
}
