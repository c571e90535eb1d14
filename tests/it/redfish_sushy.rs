//! The Redfish client against an implementation no one here wrote: sushy-tools 2.2.0's
//! `sushy-emulator` (PyPI, pinned; scripts/test.sh installs it) with its fake driver.
//! 200 systems behind four emulators driven through one Pool (power on/off/restart,
//! boot overrides read back, virtual media insert/eject with the image served from
//! loopback), wrong credentials, an emulator killed mid-operation and restarted, and a
//! TLS emulator with a self-signed certificate (refused without the CA, accepted with
//! it or with `insecure`).
//!
//! sushy's fake driver applies power changes 1-11 s after the action (so the tests poll),
//! always reports `BootSourceOverrideEnabled: Continuous`, has no SessionService (basic
//! auth), and fails `UefiHttp` + `HttpBootUri` with 400 (only its libvirt driver stores
//! the URI; tests/redfish_libvirt covers that path).

use crate::support;

use std::time::{Duration, Instant};

use bootplane::redfish::*;
use futures::future::join_all;
use support::sushy::{fake_systems, Options, Sushy};

const USER: &str = "bmcadmin";
const PASSWORD: &str = "sushy-Pa55-never-printed";

fn settings() -> Settings {
    Settings {
        timeout: Duration::from_secs(10),
        attempts: 4,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
        per_bmc_concurrency: 4,
        global_concurrency: 12,
        ..Settings::default()
    }
}

fn target(url: &str, password: &str) -> Target {
    Target {
        base_url: url.into(),
        username: USER.into(),
        password: Password(password.into()),
        insecure: false,
    }
}

fn auth() -> Option<(String, String)> {
    Some((USER.into(), PASSWORD.into()))
}

fn clean(e: Error) -> Error {
    for text in [format!("{e}"), format!("{e:?}")] {
        assert!(!text.contains(PASSWORD), "password in error: {text}");
    }
    e
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Start emulators in parallel (each takes a second or so to import Flask).
fn start_all(opts: Vec<Options>) -> Vec<Sushy> {
    std::thread::scope(|s| {
        let handles: Vec<_> = opts
            .into_iter()
            .map(|o| s.spawn(move || Sushy::start(o)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Serve `/boot/<name>` (a few bytes standing in for an ISO) on loopback, for sushy to
/// download on InsertMedia; returns the URL prefix.
async fn image_server() -> String {
    let app = axum::Router::new().route(
        "/boot/{name}",
        axum::routing::get(|| async { vec![0x43u8; 64 * 1024] }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/boot", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Poll until every system reports `want` (the fake driver applies changes 1-11 s late).
async fn wait_power(bmcs: &[(Bmc, Vec<String>)], want: &[PowerState], limit: Duration) {
    let start = Instant::now();
    loop {
        let reads = bmcs
            .iter()
            .flat_map(|(b, ids)| ids.iter().map(move |id| b.system(id)));
        let states: Vec<_> = join_all(reads)
            .await
            .into_iter()
            .map(|s| s.unwrap().power_state)
            .collect();
        let off: Vec<_> = states
            .iter()
            .zip(want.iter().cycle())
            .filter(|(s, w)| **s != Some(**w))
            .collect();
        if off.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{} systems not yet in the wanted state after {limit:?}: {:?}",
            off.len(),
            &off[..off.len().min(5)]
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[test]
fn two_hundred_systems_power_boot_and_media() {
    let emulators = start_all(
        (0..4)
            .map(|g| Options {
                systems: fake_systems(g, 50),
                auth: auth(),
                ..Options::default()
            })
            .collect(),
    );
    runtime().block_on(async {
        let pool = Pool::new(settings()).unwrap();
        let mut fleet = Vec::new();
        for e in &emulators {
            let bmc = pool.bmc(target(&e.base_url, PASSWORD));
            let root = bmc.service_root().await.unwrap();
            assert_eq!(root.session_service, None, "sushy has no SessionService");
            let ids = bmc.systems().await.unwrap();
            assert_eq!(ids.len(), 50);
            fleet.push((bmc, ids));
        }
        // find_system by UUID, upper-cased (the match ignores case).
        let found = fleet[2]
            .0
            .find_system(Some(&fake_systems(2, 50)[7].uuid.to_uppercase()))
            .await
            .unwrap();
        assert_eq!(
            found.uuid.as_deref(),
            Some(fake_systems(2, 50)[7].uuid.as_str())
        );

        let t = Instant::now();
        let systems = join_all(fleet.iter().flat_map(|(b, ids)| {
            ids.iter()
                .map(move |id| async move { (b.clone(), b.system(id).await.unwrap()) })
        }))
        .await;
        assert_eq!(systems.len(), 200);
        assert!(
            systems[0].1.reset_types.iter().all(|t| t != "PowerCycle"),
            "sushy does not list PowerCycle"
        );
        assert!(matches!(
            clean(
                systems[0]
                    .0
                    .reset(&systems[0].1, ResetType::PowerCycle)
                    .await
                    .unwrap_err()
            ),
            Error::Unsupported(_)
        ));

        // Everything On.
        join_all(systems.iter().map(|(b, s)| b.reset(s, ResetType::On)))
            .await
            .into_iter()
            .for_each(|r| r.unwrap());
        wait_power(&fleet, &[PowerState::On], Duration::from_secs(25)).await;
        // Half ForceOff, half ForceRestart (Off at once, On again 1-11 s later).
        join_all(systems.iter().enumerate().map(|(i, (b, s))| {
            b.reset(
                s,
                if i % 2 == 0 {
                    ResetType::ForceOff
                } else {
                    ResetType::ForceRestart
                },
            )
        }))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
        wait_power(
            &fleet,
            &[PowerState::Off, PowerState::On],
            Duration::from_secs(25),
        )
        .await;
        let power_secs = t.elapsed().as_secs_f64();

        for (e, (_, ids)) in emulators.iter().zip(&fleet) {
            let st = pool.stats(&e.base_url);
            assert!(st.max_in_flight <= 4, "{}: {st:?}", e.base_url);
            assert!(st.requests >= 1 + 1 + 3 * ids.len() as u64, "{st:?}");
        }
        eprintln!(
            "200 systems: on, then off/restart, in {power_secs:.1} s; stats {:?}",
            emulators
                .iter()
                .map(|e| pool.stats(&e.base_url))
                .collect::<Vec<_>>()
        );

        boot_overrides_read_back(&fleet).await;
        media_insert_eject(&fleet).await;
    });
}

/// Pxe and Cd read back (Continuous: sushy ignores Once); UefiHttp without a URI
/// becomes Pxe; UefiHttp with HttpBootUri is refused by the fake driver (400).
async fn boot_overrides_read_back(fleet: &[(Bmc, Vec<String>)]) {
    for (bmc, ids) in fleet {
        let id = &ids[3];
        for (target, want) in [
            (BootTarget::Pxe, "Pxe"),
            (BootTarget::Cd, "Cd"),
            (BootTarget::Hdd, "Hdd"),
            (BootTarget::UefiHttp, "Pxe"),
        ] {
            let s = bmc.system(id).await.unwrap();
            assert!(
                s.boot.allowed_targets.iter().any(|t| t == target.as_str()),
                "{:?}",
                s.boot.allowed_targets
            );
            let o = BootOverride {
                target,
                once: true,
                http_boot_uri: None,
                mode: Some("UEFI".into()),
            };
            bmc.set_boot_override(&s, &o).await.unwrap();
            let s = bmc.system(id).await.unwrap();
            assert_eq!(s.boot.target.as_deref(), Some(want), "{target:?}");
            assert_eq!(
                s.boot.enabled.as_deref(),
                Some("Continuous"),
                "sushy always reports Continuous"
            );
            assert_eq!(s.boot.mode.as_deref(), Some("UEFI"));
        }
    }
    let (bmc, ids) = &fleet[0];
    let s = bmc.system(&ids[4]).await.unwrap();
    let url = format!("{}/m4.iso", image_server().await);
    let o = BootOverride {
        target: BootTarget::UefiHttp,
        once: true,
        http_boot_uri: Some(url),
        mode: None,
    };
    let e = clean(bmc.set_boot_override(&s, &o).await.unwrap_err());
    assert!(
        matches!(e, Error::Status { status: 400, ref message } if message.contains("HttpBootUri")),
        "{e}"
    );
}

async fn media_insert_eject(fleet: &[(Bmc, Vec<String>)]) {
    let images = image_server().await;
    for (n, (bmc, ids)) in fleet.iter().enumerate() {
        let s = bmc.system(&ids[5]).await.unwrap();
        let vms = bmc.virtual_media(&s).await.unwrap();
        let cd = vms
            .iter()
            .find(|v| v.media_types.iter().any(|t| t == "CD"))
            .expect("a CD device");
        assert!(cd.insert_target.is_some() && cd.eject_target.is_some());
        let url = format!("{images}/machine{n}.iso");
        bmc.insert_media(cd, &url).await.unwrap();
        let cd = bmc
            .virtual_media(&s)
            .await
            .unwrap()
            .into_iter()
            .find(|v| v.id == cd.id)
            .unwrap();
        assert_eq!(
            (cd.image.as_deref(), cd.inserted),
            (Some(url.as_str()), true)
        );
        bmc.eject_media(&cd).await.unwrap();
        let cd = bmc
            .virtual_media(&s)
            .await
            .unwrap()
            .into_iter()
            .find(|v| v.id == cd.id)
            .unwrap();
        assert!(!cd.inserted && cd.image.is_none(), "{cd:?}");
    }
}

#[test]
fn wrong_credentials_cost_two_requests() {
    let e = Sushy::start(Options {
        systems: fake_systems(9, 1),
        auth: auth(),
        ..Options::default()
    });
    runtime().block_on(async {
        let pool = Pool::new(settings()).unwrap();
        let bmc = pool.bmc(target(&e.base_url, "not-the-password"));
        let err = clean(bmc.find_system(None).await.unwrap_err());
        assert_eq!(err, Error::Unauthorized(401));
        assert_eq!(err.reason(), "CredentialsRefused");
        // sushy (like the spec) serves the service root without credentials; the first
        // authenticated request is refused and not retried.
        assert_eq!(
            pool.stats(&e.base_url).requests,
            2,
            "service root + one refused request"
        );
        let ok = pool.bmc(target(&e.base_url, PASSWORD));
        ok.find_system(None).await.unwrap();
    });
}

#[test]
fn an_emulator_killed_mid_operation_and_restarted() {
    let mut e = Sushy::start(Options {
        systems: fake_systems(7, 20),
        auth: auth(),
        ..Options::default()
    });
    let rt = runtime();
    let pool = Pool::new(Settings {
        timeout: Duration::from_secs(3),
        attempts: 8,
        backoff_base: Duration::from_millis(300),
        ..settings()
    })
    .unwrap();
    let bmc = pool.bmc(target(&e.base_url, PASSWORD));
    let systems = rt.block_on(async {
        let ids = bmc.systems().await.unwrap();
        join_all(ids.iter().map(|id| bmc.system(id)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    });
    // 20 resets in flight (4 at a time) while the emulator dies and comes back 1.5 s later
    // (plus its start-up); 8 attempts with backoff up to 2 s usually outlast that.
    let ops: Vec<_> = systems
        .iter()
        .map(|s| {
            let (b, s) = (bmc.clone(), s.clone());
            rt.spawn(async move { b.reset(&s, ResetType::On).await })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    let before = pool.stats(&e.base_url).requests;
    e.kill();
    std::thread::sleep(Duration::from_millis(1500));
    e.restart();
    let outcomes: Vec<Result<(), Error>> = rt
        .block_on(join_all(ops))
        .into_iter()
        .map(|j| j.unwrap())
        .collect();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| clean(e.clone()))
        .collect();
    for err in &failed {
        assert!(
            matches!(err, Error::Unreachable(_) | Error::Timeout(_)),
            "{err}"
        );
        assert!(err.transient());
    }
    let sent = pool.stats(&e.base_url).requests - before;
    assert!(
        sent <= 20 * 8,
        "no retry storm: {sent} requests for 20 operations"
    );
    eprintln!(
        "outage: {} of 20 resets failed (Unreachable/Timeout), {sent} requests",
        failed.len()
    );
    // Works again: the failed ones are re-issued and all systems come up.
    rt.block_on(async {
        for (s, r) in systems.iter().zip(&outcomes) {
            if r.is_err() {
                bmc.reset(s, ResetType::On).await.unwrap();
            }
        }
        let ids: Vec<String> = systems.iter().map(|s| s.odata_id.clone()).collect();
        wait_power(
            &[(bmc.clone(), ids)],
            &[PowerState::On],
            Duration::from_secs(25),
        )
        .await;
    });
}

#[test]
fn tls_with_a_self_signed_certificate() {
    let e = Sushy::start(Options {
        systems: fake_systems(8, 1),
        auth: auth(),
        tls: true,
        ..Options::default()
    });
    assert!(e.base_url.starts_with("https://"));
    runtime().block_on(async {
        // Without the CA: refused, not retried.
        let pool = Pool::new(settings()).unwrap();
        let err = clean(
            pool.bmc(target(&e.base_url, PASSWORD))
                .find_system(None)
                .await
                .unwrap_err(),
        );
        assert!(matches!(err, Error::Tls(_)), "{err}");
        assert_eq!(err.reason(), "TLSError");
        assert!(!err.transient());
        assert_eq!(pool.stats(&e.base_url).requests, 1);

        // With the certificate as the configured CA bundle, after an unrelated
        // self-signed one (bundles hold several).
        let other_dir = tempfile::tempdir().unwrap();
        let (other, _) = support::sushy::self_signed(other_dir.path(), [127, 0, 0, 2].into());
        let mut bundle = std::fs::read(other).unwrap();
        bundle.extend_from_slice(e.cert_pem.as_ref().unwrap());
        let pool = Pool::new(Settings {
            ca_pem: Some(bundle),
            ..settings()
        })
        .unwrap();
        let s = pool
            .bmc(target(&e.base_url, PASSWORD))
            .find_system(None)
            .await
            .unwrap();
        assert_eq!(s.uuid.as_deref(), Some(fake_systems(8, 1)[0].uuid.as_str()));

        // Without the CA but insecure for this BMC.
        let pool = Pool::new(settings()).unwrap();
        let t = Target {
            insecure: true,
            ..target(&e.base_url, PASSWORD)
        };
        pool.bmc(t).find_system(None).await.unwrap();

        // A bundle that is not PEM is refused when the pool is made.
        assert!(matches!(
            Pool::new(Settings {
                ca_pem: Some(b"not pem".to_vec()),
                ..settings()
            }),
            Err(Error::Tls(_))
        ));
    });
}
