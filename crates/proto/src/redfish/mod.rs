//! A small typed Redfish client (DMTF DSP0266) for the BMCs bootplane drives: power,
//! one-time boot overrides and virtual media, on the HTTP stack the project already
//! has (hyper, through `reqwest` with rustls).
//!
//! - **Connections**: one [`Pool`] per process holds the TLS settings (a configured CA
//!   bundle; a per-BMC `insecure` opt-out, default verify), the global concurrency
//!   limit and one limit per BMC, and the sessions.
//! - **Sessions**: `POST /redfish/v1/SessionService/Sessions` and `X-Auth-Token`, with
//!   basic auth when the BMC has no session service; a token refused later (401) is
//!   dropped and the request retried once with a new session.
//! - **Retries**: connect errors, timeouts and 5xx/429 are retried with exponential
//!   backoff and full jitter, bounded by a count; 4xx is not retried.
//! - **ETags**: a PATCH carries `If-Match` with the resource's ETag when the BMC sent
//!   one; a 412/428 re-reads the resource and retries once.
//! - **Tasks**: a 202 with a `Location` task monitor is polled until it completes.
//!
//! Passwords are held in [`Password`], whose `Debug`/`Display` print `<redacted>`; no
//! error message carries a credential (requests carry them in headers only).
//!
//! **Invariant:** nothing here knows bootplane's resources; the power driver and the BMC
//! reconciler map Redfish objects to Server and BMC status.

mod client;
pub mod parse;
mod transport;
mod types;

pub use client::{Bmc, BmcStats, Pool};
pub use types::*;
