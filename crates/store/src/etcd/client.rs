//! One connection to the etcd cluster (`[store.etcd]`): endpoints balanced by the
//! client, TLS with the configured CA bundle and client certificate, timeouts on
//! every request, and `require_leader` so a member cut off from the quorum refuses at
//! once instead of holding a request until its timeout.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::settings::EtcdConfig;

/// Connect to the cluster. Connecting is lazy per member: this fails only when the
/// configuration is unusable (unreadable CA or key, bad URL), not when members are
/// down; requests then fail with a timeout or `Unavailable`.
pub async fn connect(cfg: &EtcdConfig) -> Result<etcd_client::Client> {
    let mut opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(cfg.dial_timeout_ms))
        .with_timeout(Duration::from_millis(cfg.request_timeout_ms))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca)
            .with_context(|| format!("reading store.etcd.ca_file {}", ca.display()))?;
        let mut tls =
            etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem));
        if let (Some(c), Some(k)) = (&cfg.cert_file, &cfg.key_file) {
            let cert = std::fs::read(c)
                .with_context(|| format!("reading store.etcd.cert_file {}", c.display()))?;
            let key = std::fs::read(k)
                .with_context(|| format!("reading store.etcd.key_file {}", k.display()))?;
            tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
        }
        opts = opts.with_tls(tls);
    }
    let endpoints: Vec<String> = cfg.endpoints.clone();
    etcd_client::Client::connect(&endpoints, Some(opts))
        .await
        .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))
}
