//! `bootplane serve`: opens the store, starts the listeners and the controllers,
//! and drains them on SIGINT/SIGTERM.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::config::Config;
use crate::shutdown::{Coordinator, Shutdown};
use crate::store::Store;

/// Shared state handed to every service started by `serve`.
pub struct Context {
    pub config: Config,
    pub store: Store,
}

/// The API token: configured, or read from / generated into `<state_dir>/api-token`
/// (mode 0600).
pub fn api_token(config: &Config) -> Result<String> {
    if let Some(t) = &config.api.token {
        return Ok(t.clone());
    }
    let path = config.state_dir.join("api-token");
    load_or_create_token(&path)
}

fn load_or_create_token(path: &Path) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let token: String = {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut b);
        hex::encode(b)
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    tracing::info!(path = %path.display(), "generated a new API token");
    Ok(token)
}

/// Run every enabled service until a signal arrives, then drain (bounded).
pub async fn run(config: Config) -> Result<()> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating state dir {}", config.state_dir.display()))?;
    let token = api_token(&config)?;
    let store = Store::open(&config.state_dir)?;
    let ctx = Arc::new(Context { config, store: store.clone() });
    let coord = Coordinator::new();
    let mut tasks = tokio::task::JoinSet::new();

    // Operator API.
    let api_state = Arc::new(crate::api::rest::ApiState {
        store: store.clone(),
        token,
        max_body_bytes: ctx.config.api.max_body_bytes,
        shutdown: coord.handle(),
        metrics: Arc::new(String::new),
    });
    let listener = tokio::net::TcpListener::bind(ctx.config.api.listen)
        .await
        .with_context(|| format!("binding api listener {}", ctx.config.api.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "api listening");
    {
        let mut s = coord.handle();
        let app = crate::api::rest::router(api_state);
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { s.recv().await })
                .await
                .context("api server")
        });
    }

    if ctx.config.controller.enabled {
        let power = crate::power::from_name(&ctx.config.controller.power_driver)?;
        let ctrl = crate::controller::Controllers::new(store.clone(), power, Arc::new(crate::controller::SecretOnly));
        let (s, workers) = (coord.handle(), ctx.config.controller.workers);
        tasks.spawn(async move {
            ctrl.run(workers, s).await;
            Ok(())
        });
    }
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
    while tasks.join_next().await.is_some() {}
    let st = store.clone();
    tokio::task::spawn_blocking(move || st.close()).await.ok();
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
