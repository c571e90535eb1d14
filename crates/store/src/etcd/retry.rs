//! Sending a request to etcd again: which failures say the request was not sent (a dead
//! member's endpoint) or was written into a connection that broke under it (a member
//! killed while the client held its connection), the retry loop for both, and the
//! error a guarded write gets when a resend finds its first send may have applied it.

use std::time::Duration;

use crate::backend::KvError;

pub(super) fn unavailable(e: impl Into<Unreachable>) -> KvError {
    KvError::Unavailable(format!("etcd: {}", e.into().0))
}

/// A request that reached etcd (or may have) without an answer: see
/// [`KvError::OutcomeUnknown`].
pub(super) fn unanswered(e: impl Into<Unreachable>) -> KvError {
    KvError::OutcomeUnknown(format!("etcd: {}", e.into().0))
}

/// An etcd failure as one short line (a gRPC status' code and message, not the
/// transport's whole error chain).
pub(super) struct Unreachable(String);

impl From<etcd_client::Error> for Unreachable {
    fn from(e: etcd_client::Error) -> Self {
        Unreachable(match e {
            etcd_client::Error::GRpcStatus(s) => {
                format!("{}: {}", s.code().description().to_lowercase(), s.message())
            }
            other => other.to_string(),
        })
    }
}

impl From<&str> for Unreachable {
    fn from(s: &str) -> Self {
        Unreachable(s.to_string())
    }
}

/// Whether `e` says the request never reached an etcd member that could apply it
/// (connection refused or reset before sending, a member without a leader refusing
/// it, or the HTTP/2 client dropping it unsent as its connection closed: hyper's
/// "operation was canceled", which hyper's own pooled client retries for the same
/// reason), so sending it again cannot apply it twice.
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            tonic::Code::Unavailable => {
                s.message().contains("connect") || s.message().contains("no leader")
            }
            tonic::Code::Cancelled => s.message().contains("operation was canceled"),
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether `e` says the connection to the member broke under the request (a member
/// killed while the client still held its connection: the request is written into a
/// socket the peer has reset). The request may or may not have reached a live member
/// before that, so it is sent again only where that cannot apply it twice:
/// [`retrying`] says so to its caller.
fn broken_connection(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    let mut cause = std::error::Error::source(s);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(io.kind(), BrokenPipe | ConnectionReset | ConnectionAborted);
        }
        cause = c.source();
    }
    false
}

/// What [`retrying`] got: the answer, and whether an earlier try broke while it was being
/// sent ([`broken_connection`]), so that try's outcome is unknown.
pub(super) struct Answer<T> {
    pub(super) value: T,
    pub(super) after_break: bool,
}

/// Run `f` until it answers, within `limit`: requests that were not sent (a dead member's
/// endpoint, see [`not_sent`]) and requests whose connection broke under them
/// ([`broken_connection`]) are sent again on the next endpoint the client picks. Every
/// request sent through here is a read or a transaction guarded by the revisions it
/// read (or an unguarded put of the same value, which a second send writes again,
/// unchanged), so a second send never applies a change twice: a guarded write whose
/// first try did apply fails its guard on the second, which its caller reports as an
/// unknown outcome ([`Answer::after_break`]), not as a conflict.
pub(super) async fn retrying<T, F, Fut>(limit: Duration, mut f: F) -> Result<Answer<T>, KvError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let end = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    let mut after_break = false;
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, f()).await {
            // In flight when the time ran out: etcd may have it (a leader without a
            // quorum keeps it and commits it once the quorum is back).
            Err(_) => return Err(unanswered("request timed out (no quorum?)")),
            Ok(Ok(value)) => return Ok(Answer { value, after_break }),
            Ok(Err(e))
                if (not_sent(&e) || broken_connection(&e))
                    && tokio::time::Instant::now() + pause < end =>
            {
                after_break |= broken_connection(&e);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            // Refused before any member took it: nothing was applied.
            Ok(Err(e)) if not_sent(&e) && !after_break => return Err(unavailable(e)),
            Ok(Err(e)) => return Err(unanswered(e)),
        }
    }
}

/// The error of a guarded write that failed its guard after an earlier try broke under
/// it: that try may have been the write that changed the key.
pub(super) fn outcome_unknown() -> KvError {
    unanswered(
        "the connection to an etcd member broke while the write was sent, and sent again it \
         found the objects changed: whether the first send applied it is unknown, read them again",
    )
}
