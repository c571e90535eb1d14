//! The thin socket loop: accept (bounded by `max_connections`), one HTTP/1.1
//! connection ([`super::conn`]) per socket with a header size limit (431 beyond it), a
//! header read timeout and an idle timeout (slow or idle clients are closed) and
//! graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{conn, BootHttp};
use crate::shutdown::Shutdown;

/// Smallest request head limit accepted (hyper's floor, kept for the same config).
pub const MIN_HEADER_BYTES: usize = 8192;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// Request head limit; at least [`MIN_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout: Duration,
    /// How long a connection may wait for the first byte of a request: after the
    /// accept and between keep-alive requests.
    pub idle_timeout: Duration,
    /// How long in-flight responses may run after shutdown begins.
    pub drain_timeout: Duration,
}

impl Limits {
    pub fn from_config(c: &crate::config::HttpConfig) -> Limits {
        Limits {
            max_connections: c.max_connections.max(1),
            max_header_bytes: c.max_header_bytes.max(MIN_HEADER_BYTES),
            header_read_timeout: Duration::from_millis(c.header_read_timeout_ms.max(100)),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms.max(100)),
            drain_timeout: Duration::from_secs(8),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::from_config(&crate::config::HttpConfig::default())
    }
}

/// Serve `listener` until `shutdown`, then let open connections finish (bounded).
pub async fn run(
    listener: TcpListener,
    app: Arc<BootHttp>,
    limits: Limits,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        tokio::select! {
            _ = shutdown.recv() => break,
            res = listener.accept() => {
                let (stream, peer) = match res {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accepting boot http connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    app.metrics().connections_rejected.inc();
                    tracing::warn!(client = %peer, max = limits.max_connections, "connection limit reached, closing");
                    drop(stream);
                    continue;
                };
                let (app, child) = (app.clone(), shutdown.child());
                tokio::spawn(connection(stream, peer, app, limits, child, permit));
            }
        }
    }
    tracing::info!("boot http listener stopped accepting");
    Ok(())
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Arc<BootHttp>,
    limits: Limits,
    shutdown: Shutdown,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let client = peer.ip().to_canonical();
    app.metrics().connections_open.inc();
    // The loop closes idle connections on shutdown by itself; this bounds a response
    // still being written to the drain timeout.
    let mut reads = shutdown.child();
    let mut drain = shutdown;
    let res = tokio::select! {
        res = conn::serve(stream, client, &app, &limits, &mut reads) => res,
        _ = async {
            drain.recv().await;
            tokio::time::sleep(limits.drain_timeout).await;
        } => Ok(()),
    };
    if let Err(e) = res {
        app.metrics().connection_errors.inc();
        tracing::debug!(client = %client, error = %e, "boot http connection ended with an error");
    }
    app.metrics().connections_open.dec();
}
