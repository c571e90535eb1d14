//! The thin socket loop: accept under the shared connection admission
//! ([`crate::listen::Admission`]: `max_connections`, a per-source share of it, idle
//! connections, and responses sent slower than `slow_send_rate_bytes_per_sec`, evicted
//! to let new clients in, the idle and header read timeouts), one
//! HTTP/1.1 connection ([`super::conn`]) per socket with a header size limit (431
//! beyond it) and graceful shutdown.
//!
//! In `serve` the boot listener runs in the shape nginx has: [`run_workers`] starts
//! `http.workers` threads (default: one per core), each with its own current-thread
//! tokio runtime and its own listening socket on the same address (`SO_REUSEPORT`, so
//! the kernel spreads new connections over the sockets). A connection lives on the
//! thread that accepted it: no cross-thread wakeups or work stealing on the hot path.
//! Before binding the group, [`bind`] checks that nothing already listens on the
//! address (a second bootplane would otherwise silently share the port). The
//! connection table is one [`Admission`] shared by all workers; shutdown is the same
//! broadcast and drain as everywhere else, and each worker thread ends once its
//! connections have finished (bounded by the drain timeout). [`run`] serves one
//! listener on the caller's runtime (tests, benches).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

pub use super::settings::Limits;
use super::{conn, BootHttp};
use crate::listen::{self, Admission};
use crate::shutdown::Shutdown;

impl Limits {
    /// The admission limits of the connection table.
    pub(crate) fn admission(&self) -> listen::Limits {
        listen::Limits {
            max_connections: self.max_connections,
            max_per_source: self.max_connections_per_source,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        }
        .normalized()
    }

    /// The minimum send rate (`None`: off).
    pub(crate) fn min_rate(&self) -> Option<listen::SlowRate> {
        (self.min_send_rate > 0).then_some(listen::SlowRate {
            bytes_per_sec: self.min_send_rate,
            grace: self.send_rate_grace,
        })
    }

    fn table(&self, app: &BootHttp) -> Admission {
        let slow = (self.slow_send_rate > 0).then_some(listen::SlowRate {
            bytes_per_sec: self.slow_send_rate,
            grace: self.send_rate_grace,
        });
        Admission::with_slow(
            "boot http",
            self.admission(),
            app.metrics().connections.clone(),
            slow,
        )
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::from_config(&super::HttpConfig::default())
    }
}

/// Listening backlog of each worker socket.
const BACKLOG: u32 = 1024;

/// `workers` listening sockets on `addr` (port 0: one port chosen for all), each with
/// `SO_REUSEPORT`, for [`run_workers`]. Must be called inside a tokio runtime.
pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let socket = |a: SocketAddr| -> std::io::Result<TcpSocket> {
        let s = if a.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        s.set_reuseaddr(true)?;
        Ok(s)
    };
    if addr.port() != 0 {
        // SO_REUSEPORT lets any socket of the same user with the option join the port;
        // a plain bind first fails with EADDRINUSE if another process already listens.
        socket(addr)?.bind(addr)?;
    }
    let mut addr = addr;
    let mut out = Vec::with_capacity(workers.max(1));
    for _ in 0..workers.max(1) {
        let s = socket(addr)?;
        s.set_reuseport(true)?;
        s.bind(addr)?;
        let l = s.listen(BACKLOG)?;
        addr = l.local_addr()?;
        out.push(l.into_std()?);
    }
    Ok(out)
}

/// The number of boot listener workers for `configured` (0: one per available core).
pub fn worker_count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Serve each of `listeners` (from [`bind`]) on its own thread with a current-thread
/// runtime until `shutdown`; returns once every worker has stopped accepting and its
/// open connections have finished (bounded by the drain timeout).
pub async fn run_workers(
    listeners: Vec<std::net::TcpListener>,
    app: Arc<BootHttp>,
    limits: Limits,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let slots = limits.table(&app);
    let mut done = Vec::with_capacity(listeners.len());
    for (i, listener) in listeners.into_iter().enumerate() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building a boot http worker runtime")?;
        let (app, slots, shutdown) = (app.clone(), slots.clone(), shutdown.child());
        let (tx, rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        std::thread::Builder::new()
            .name(format!("boot-http-{i}"))
            .spawn(move || {
                let res = rt.block_on(async move {
                    let listener = TcpListener::from_std(listener)
                        .context("registering a boot http listener")?;
                    // Each connection holds a clone of `live`; the worker's runtime
                    // (and with it every task on it) ends only after they are gone.
                    let (live, mut gone) = mpsc::channel::<()>(1);
                    accept(listener, app, limits, slots, shutdown, live).await;
                    let _ = gone.recv().await;
                    Ok(())
                });
                let _ = tx.send(res);
            })
            .context("starting a boot http worker thread")?;
        done.push(rx);
    }
    for rx in done {
        rx.await
            .map_err(|_| anyhow::anyhow!("a boot http worker thread panicked"))??;
    }
    tracing::info!("boot http workers stopped");
    Ok(())
}

/// Serve `listener` on the current runtime until `shutdown`, then let open connections
/// finish (bounded) in the background.
pub async fn run(
    listener: TcpListener,
    app: Arc<BootHttp>,
    limits: Limits,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let slots = limits.table(&app);
    let (live, _) = mpsc::channel::<()>(1);
    accept(listener, app, limits, slots, shutdown, live).await;
    Ok(())
}

/// The accept loop: a connection task per admitted socket.
async fn accept(
    listener: TcpListener,
    app: Arc<BootHttp>,
    limits: Limits,
    slots: Admission,
    mut shutdown: Shutdown,
    live: mpsc::Sender<()>,
) {
    loop {
        let (stream, peer, admitted) = tokio::select! {
            _ = shutdown.recv() => break,
            c = slots.accept(&listener) => c,
        };
        let (app, child, live) = (app.clone(), shutdown.child(), live.clone());
        tokio::spawn(async move {
            connection(stream, peer, app, limits, child, admitted).await;
            drop(live);
        });
    }
    tracing::info!("boot http listener stopped accepting");
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Arc<BootHttp>,
    limits: Limits,
    shutdown: Shutdown,
    admitted: listen::Conn,
) {
    let _ = stream.set_nodelay(true);
    let client = peer.ip().to_canonical();
    // The loop closes idle connections on shutdown by itself; this bounds a response
    // still being written to the drain timeout.
    let mut reads = shutdown.child();
    let mut drain = shutdown;
    let res = tokio::select! {
        res = conn::serve(stream, client, &app, &limits, &mut reads, &admitted) => res,
        _ = async {
            drain.recv().await;
            tokio::time::sleep(limits.drain_timeout).await;
        } => Ok(()),
    };
    if let Err(e) = res {
        app.metrics().connection_errors.inc();
        tracing::debug!(client = %client, error = %e, "boot http connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_shares_one_port_and_refuses_a_second_group() {
        let group = bind("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(group.len(), 3);
        let addr = group[0].local_addr().unwrap();
        assert!(group.iter().all(|l| l.local_addr().unwrap() == addr));
        // Another group (another bootplane) on the same address must not join it.
        let err = bind(addr, 2).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        // Nor may a plain listener.
        assert!(std::net::TcpListener::bind(addr).is_err());
        drop(group);
        assert_eq!(bind(addr, 1).unwrap().len(), 1);
        assert_eq!(worker_count(3), 3);
        assert!(worker_count(0) >= 1);
    }
}
