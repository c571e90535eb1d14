//! Serving an axum router (the API listener) under [`Admission`]: hyper runs each
//! connection as before, with the socket wrapped so that the first bytes of a request
//! head mark the connection as reading a head, and the router wrapped so that a request
//! marks it busy from its head until its response body has been sent or dropped (a
//! watch stays busy for as long as it streams). A [`super::Watchdog`] beside the
//! connection closes it when idle or slow too long; an evicted connection is shut down
//! gracefully (hyper finishes writing what it has, then closes).
//!
//! With [`Tls`], the handshake runs first, under the same watchdog: the ClientHello's
//! bytes start the header read timeout, so a client that never finishes the handshake
//! is closed by it. A verified client certificate chain is turned into request
//! extensions once ([`Tls::peer`]) and added to every request of the connection.
//!
//! Every request also carries its connection's [`ConnId`] (the API caps watches per
//! connection), and HTTP/2 connections advertise `max_concurrent_streams` (what
//! [`serve_router`] is given), so one connection cannot multiplex unbounded requests.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Result;
use axum::body::Body;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use rustls::pki_types::CertificateDer;

use super::{Admission, Conn, Expiry, Slot};
use crate::shutdown::Shutdown;

/// How long open connections may take to finish once shutdown begins.
const DRAIN: Duration = Duration::from_secs(8);
/// How long an evicted connection may take to finish writing (it was idle).
const EVICT_GRACE: Duration = Duration::from_secs(1);

/// A connection's number, unique for the process's life, added to each of its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u64);

impl ConnId {
    fn next() -> ConnId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ConnId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// TLS for a router's connections.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// What a connection's verified client certificate chain adds to each of its
    /// requests.
    pub peer: fn(&[CertificateDer<'static>]) -> http::Extensions,
}

/// Accept loop for an axum router under `admission` (TLS first when `tls` is given;
/// HTTP/2 connections limited to `max_streams` concurrent streams); on shutdown stop
/// accepting, let open connections finish (idle ones close at once, in-flight
/// responses get up to 8 s).
pub async fn serve_router(
    listener: TcpListener,
    app: axum::Router,
    admission: Admission,
    tls: Option<Tls>,
    max_streams: u32,
    mut shutdown: Shutdown,
) -> Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(max_streams.max(1));
    // Each connection task holds a clone of `live`; `gone` yields once all are dropped.
    let (live, mut gone) = mpsc::channel::<()>(1);
    loop {
        let (stream, peer, conn) = tokio::select! {
            _ = shutdown.recv() => break,
            c = admission.accept(&listener) => c,
        };
        let (builder, app, child, live, tls) = (
            builder.clone(),
            app.clone(),
            shutdown.child(),
            live.clone(),
            tls.clone(),
        );
        tokio::spawn(async move {
            connection(stream, peer, conn, &builder, app, tls, child).await;
            drop(live);
        });
    }
    drop(listener);
    drop(live);
    if tokio::time::timeout(DRAIN, gone.recv()).await.is_err() {
        tracing::warn!("api connections still open after {DRAIN:?}, closing");
    }
    Ok(())
}

/// One connection: the TLS handshake when configured, then hyper, its watchdog and
/// shutdown, until one of them ends it. Each request carries the peer's address as
/// axum's `ConnectInfo` (the audit log's source).
async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    conn: Conn,
    builder: &auto::Builder<TokioExecutor>,
    app: axum::Router,
    tls: Option<Tls>,
    mut shutdown: Shutdown,
) {
    let _ = stream.set_nodelay(true);
    let slot = conn.slot().clone();
    let tracked = Tracked {
        stream,
        slot: slot.clone(),
    };
    let mut watchdog = conn.watchdog();
    let Some(tls) = tls else {
        let io = TokioIo::new(tracked);
        return http(io, peer, conn, watchdog, builder, app, None, shutdown).await;
    };
    let stream = tokio::select! {
        biased;
        r = tls.acceptor.accept(tracked) => match r {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "api tls handshake failed");
                return;
            }
        },
        why = &mut watchdog => {
            tracing::debug!(reason = %why, "closing api connection in its tls handshake");
            return;
        }
        _ = shutdown.recv() => return,
    };
    let ext = stream
        .get_ref()
        .1
        .peer_certificates()
        .map(tls.peer)
        .filter(|e| !e.is_empty());
    http(
        TokioIo::new(stream),
        peer,
        conn,
        watchdog,
        builder,
        app,
        ext,
        shutdown,
    )
    .await
}

/// Serve HTTP on an (accepted, handshaken) connection; `ext` is added to each request.
#[allow(clippy::too_many_arguments)]
async fn http<I>(
    io: TokioIo<I>,
    peer: std::net::SocketAddr,
    conn: Conn,
    mut watchdog: super::Watchdog,
    builder: &auto::Builder<TokioExecutor>,
    app: axum::Router,
    ext: Option<http::Extensions>,
    mut shutdown: Shutdown,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slot = conn.slot().clone();
    let inner = TowerToHyperService::new(app);
    let id = ConnId::next();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        req.extensions_mut().insert(id);
        if let Some(e) = &ext {
            req.extensions_mut().extend(e.clone());
        }
        let busy = Busy::begin(slot.clone());
        let fut = hyper::service::Service::call(&inner, req);
        async move {
            let Some(busy) = busy else {
                return Ok::<_, Infallible>(evicted());
            };
            let resp = match fut.await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok(resp.map(|inner| Guarded {
                inner,
                _busy: Some(busy),
            }))
        }
    });
    let hconn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(hconn);
    // Biased: the connection is polled first, so a head it starts or a response it
    // finishes is seen by the watchdog in the same poll.
    let grace = tokio::select! {
        biased;
        res = hconn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "api connection ended with an error");
            }
            return;
        }
        why = &mut watchdog => match why {
            Expiry::Evicted => EVICT_GRACE,
            Expiry::Idle | Expiry::Header => {
                tracing::debug!(reason = %why, "closing api connection");
                return;
            }
        },
        _ = shutdown.recv() => DRAIN,
    };
    hconn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(grace, hconn).await;
    drop(conn);
}

/// The answer to a request that arrived on a connection just evicted.
fn evicted() -> Response<Guarded> {
    let mut r = Response::new(Guarded {
        inner: Body::from("connection closed to make room for others, retry\n"),
        _busy: None,
    });
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

/// Marks its connection busy while alive (a request in progress, through its response
/// body).
struct Busy(Arc<Slot>);

impl Busy {
    fn begin(slot: Arc<Slot>) -> Option<Busy> {
        slot.begin().then_some(Busy(slot))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
        // The body may be dropped on another task (HTTP/2 streams are spawned).
        self.0.wake();
    }
}

/// A response body that keeps its connection busy until sent or dropped.
struct Guarded {
    inner: Body,
    _busy: Option<Busy>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, noting on its [`Slot`] when the bytes of a new request head arrive.
struct Tracked {
    stream: TcpStream,
    slot: Arc<Slot>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.slot.head_started();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
