//! `bootplane serve`: opens the store, starts the listeners and the controllers,
//! and drains them on SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::config::Config;
use crate::shutdown::{Coordinator, Shutdown};

/// Shared state handed to every service started by `serve`.
pub struct Context {
    pub config: Config,
}

/// Run every enabled service until a signal arrives, then drain (bounded).
pub async fn run(config: Config) -> Result<()> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating state dir {}", config.state_dir.display()))?;
    let ctx = Arc::new(Context { config });
    let coord = Coordinator::new();
    let mut tasks = tokio::task::JoinSet::new();

    if ctx.config.dhcp.enabled {
        let (c, s) = (ctx.clone(), coord.handle());
        tasks.spawn(async move { crate::dhcp::serve(c, s).await.context("dhcp server") });
    }
    if ctx.config.tftp.enabled {
        let (c, s) = (ctx.clone(), coord.handle());
        tasks.spawn(async move { crate::tftp::serve(c, s).await.context("tftp server") });
    }

    tracing::info!(state_dir = %ctx.config.state_dir.display(), "bootplane started");
    let failed = tokio::select! {
        _ = crate::shutdown::signal() => None,
        Some(res) = tasks.join_next() => Some(res),
    };
    if !coord.drain(Duration::from_secs(10)).await {
        tracing::warn!("some tasks did not finish within 10s of shutdown");
    }
    tasks.abort_all();
    if let Some(res) = failed {
        res.context("service task panicked")??;
        anyhow::bail!("a service stopped unexpectedly");
    }
    tracing::info!("bootplane stopped");
    Ok(())
}

/// Keeps a service alive until shutdown (for services with nothing else to wait on).
pub async fn until_shutdown(mut s: Shutdown) {
    s.recv().await
}
