//! `bootplane serve`: opens the store, starts the listeners and the controllers,
//! and drains them on SIGINT/SIGTERM.
//!
//! The one composition root: every service below is started here with its own config
//! section, the handles it needs (store, indexes, metrics) and a shutdown handle, and
//! nothing outside `main.rs` imports this module.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::config::Config;
use crate::shutdown::{Coordinator, Shutdown};
use crate::store::Store;

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
    // Private (0700, files 0600) before anything secret is written into it.
    crate::statedir::prepare(&config.state_dir)?;
    let token = api_token(&config)?;
    let store = Store::open(&config.state_dir)?;
    let coord = Coordinator::new();
    let mut tasks = tokio::task::JoinSet::new();

    // Boot side: catalog, store-backed boot index, metrics shared with /metrics.
    let catalog = crate::http::catalog::load(&config.boot.images_dir)?;
    let templates = crate::ignition::templates::TemplateSet::load(&config.boot.ignition_templates)
        .with_context(|| {
            format!(
                "loading ignition templates from {}",
                config.boot.ignition_templates.display()
            )
        })?;
    let resolver = Arc::new(
        crate::controller::bootside::CatalogResolver::with_templates(
            catalog,
            crate::http::catalog::FileHasher::new(&config.boot.images_dir),
            templates,
        ),
    );
    let boot_slot = crate::api::preview::BootSlot::default();
    let http_metrics = Arc::new(crate::http::Metrics::new());
    let runner = crate::provision::from_config(&config.provision)?;
    let leases = crate::dhcp::leases::LeaseIndex::default();
    let dhcp_metrics = crate::dhcp::Metrics::default();
    let tftp_metrics = Arc::new(crate::tftp::Metrics::default());

    // Operator API.
    let mut metrics = prometheus_client::registry::Registry::default();
    http_metrics.register(&mut metrics);
    if config.dhcp.enabled {
        dhcp_metrics.register(&mut metrics);
    }
    if config.tftp.enabled {
        tftp_metrics.register(&mut metrics);
    }
    let api_conns = crate::listen::ConnMetrics::default();
    api_conns.register(metrics.sub_registry_with_prefix("bootplane_api"));
    let api_state = Arc::new(crate::api::rest::ApiState {
        store: store.clone(),
        token,
        max_body_bytes: config.api.max_body_bytes,
        body_read_timeout: std::time::Duration::from_millis(config.api.body_read_timeout_ms),
        shutdown: coord.handle(),
        metrics,
    });
    let listener = tokio::net::TcpListener::bind(config.api.listen)
        .await
        .with_context(|| format!("binding api listener {}", config.api.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "api listening");
    {
        let s = coord.handle();
        let extra = crate::provision::router(runner.clone())
            .merge(crate::api::rest::leases_router(leases.clone()))
            .merge(crate::api::preview::router(boot_slot.clone()));
        let app = crate::api::rest::router(api_state, Some(extra));
        let admission = crate::listen::Admission::new("api", config.api.limits(), api_conns);
        tasks.spawn(async move {
            crate::listen::router::serve_router(listener, app, admission, s)
                .await
                .context("api server")
        });
    }

    if config.controller.enabled {
        let power = crate::power::from_config(
            &config.controller.power_driver,
            &config.power,
            &config.state_dir,
        )?;
        let ctrl = crate::controller::Controllers::new(store.clone(), power, resolver.clone());
        let (s, workers) = (coord.handle(), config.controller.workers);
        tasks.spawn(async move {
            ctrl.run(workers, s).await;
            Ok(())
        });
    }
    // s390x flow: the NFS export backend and the provisioning reconcilers.
    {
        let nfs = &config.nfs;
        let backend: Arc<dyn crate::nfs::ExportBackend> = if nfs.enabled {
            crate::nfs::from_config(nfs, &config.state_dir)?
        } else {
            Arc::new(crate::nfs::Disabled)
        };
        let p = &config.provision;
        let settings = crate::controller::provisioning::Settings {
            images_dir: p
                .images_dir
                .clone()
                .unwrap_or_else(|| config.state_dir.join("nfs-images")),
            nfs_server: p.nfs_server.clone(),
            job_address: p.job_address.clone(),
            nfs_enabled: nfs.enabled,
        };
        if nfs.enabled {
            std::fs::create_dir_all(&settings.images_dir)
                .with_context(|| format!("creating {}", settings.images_dir.display()))?;
        }
        if config.controller.enabled {
            let c = crate::controller::provisioning::Provisioning::new(
                store.clone(),
                backend,
                runner,
                settings,
            );
            let (s, workers, run_backend) =
                (coord.handle(), config.controller.workers, nfs.enabled);
            tasks.spawn(async move {
                c.run(workers, s, run_backend).await;
                Ok(())
            });
        } else if nfs.enabled {
            let s = coord.handle();
            tasks.spawn(async move {
                backend.run(s).await;
                Ok(())
            });
        }
    }
    {
        let dhcp_leases = config.dhcp.enabled.then(|| leases.clone());
        let index = crate::controller::bootside::StoreBootIndex::start(
            store.clone(),
            resolver,
            config.public_http_url(),
            dhcp_leases,
            coord.handle(),
        );
        let app = Arc::new(crate::http::BootHttp::from_config(
            &config.http,
            &config.boot,
            &config.state_dir,
            index,
            http_metrics,
        )?);
        let _ = boot_slot.set(app.clone());
        let (http, s) = (config.http.clone(), coord.handle());
        tasks.spawn(async move {
            crate::http::run(&http, app, s)
                .await
                .context("boot http server")
        });
    }
    if config.dhcp.enabled {
        let settings =
            crate::dhcp::DhcpSettings::from_config(&config.dhcp, &config.public_http_url())?;
        // Static reservations: the config file's plus the registered Servers'.
        let r = crate::dhcp::reservations::start(store.clone(), &settings, coord.handle());
        let (state_dir, l, s) = (config.state_dir.clone(), leases.clone(), coord.handle());
        tasks.spawn(async move {
            crate::dhcp::run(settings, &state_dir, dhcp_metrics, l, Some(r), s)
                .await
                .context("dhcp server")
        });
    }
    if config.tftp.enabled {
        let (tftp, s) = (config.tftp.clone(), coord.handle());
        tasks.spawn(async move {
            crate::tftp::run(&tftp, tftp_metrics, s)
                .await
                .context("tftp server")
        });
    }

    tracing::info!(state_dir = %config.state_dir.display(), "bootplane started");
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
