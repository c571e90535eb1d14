//! The Redfish client (`bootplane::redfish`) against the in-process fake BMC
//! (`tests/support/fakebmc.rs`, real loopback sockets): sessions and the basic-auth
//! fallback, retries with backoff counted server-side (no retry storm), timeouts, bad
//! bodies, ETags, task monitors, the per-BMC and global concurrency limits as the server
//! saw them, unsupported boot targets, and no password or token in any error.

use crate::support;

use std::time::{Duration, Instant};

use bootplane::redfish::*;
use support::fakebmc::{uuid_of, FakeBmc, Fault, TaskEnd};

const PASSWORD: &str = "Pa55-w0rd-never-printed";

fn settings() -> Settings {
    Settings {
        timeout: Duration::from_secs(5),
        attempts: 3,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        task_timeout: Duration::from_secs(10),
        ..Settings::default()
    }
}

fn target(url: &str, password: &str) -> Target {
    Target {
        base_url: url.into(),
        username: "admin".into(),
        password: Password(password.into()),
        insecure: false,
    }
}

fn bmc_on(fake: &FakeBmc, s: Settings) -> (Pool, Bmc) {
    let pool = Pool::new(s).unwrap();
    let bmc = pool.bmc(target(&fake.base_url, PASSWORD));
    (pool, bmc)
}

/// Neither the password nor a session token ("tok<n>x<m>", see fakebmc) in any form of
/// the error; returns it.
fn clean(e: Error) -> Error {
    for text in [format!("{e}"), format!("{e:?}"), e.reason().to_string()] {
        assert!(!text.contains(PASSWORD), "password in error: {text}");
        assert!(
            !text.contains("UGE1NS"),
            "basic credentials in error: {text}"
        );
        assert!(!text.contains("tok1x"), "token in error: {text}");
    }
    e
}

async fn fake(b: support::fakebmc::Builder) -> FakeBmc {
    b.credentials("admin", PASSWORD).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_created_once_shared_and_renewed_after_401() {
    let fake = fake(FakeBmc::builder().systems(3).sessions(true)).await;
    let (_pool, bmc) = bmc_on(&fake, settings());
    let root = bmc.service_root().await.unwrap();
    assert_eq!(
        root.session_service.as_deref(),
        Some("/redfish/v1/SessionService")
    );
    // Lower case: the UUID match ignores case.
    let s = bmc
        .find_system(Some(&uuid_of(1).to_lowercase()))
        .await
        .unwrap();
    assert_eq!(s.odata_id, "/redfish/v1/Systems/2");
    assert!(
        fake.last_auth().unwrap().starts_with("Token tok"),
        "{:?}",
        fake.last_auth()
    );
    // Many concurrent requests, one session.
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let b = bmc.clone();
            let p = fake.system_path(i % 3);
            tokio::spawn(async move { b.system(&p).await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(fake.sessions_created(), 1);
    // The BMC forgets the session: one 401, a new session, the request again.
    fake.expire_sessions();
    let before = fake.requests("/redfish/v1/Systems/1");
    let s = bmc.system("/redfish/v1/Systems/1").await.unwrap();
    assert_eq!(s.uuid.as_deref(), Some(uuid_of(0).as_str()));
    assert_eq!(fake.sessions_created(), 2);
    assert_eq!(
        fake.requests("/redfish/v1/Systems/1") - before,
        2,
        "the 401 and the retry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_without_session_service_or_when_sessions_are_refused() {
    let plain = fake(FakeBmc::builder()).await;
    let (_p, bmc) = bmc_on(&plain, settings());
    let s = bmc.find_system(None).await.unwrap();
    assert_eq!(s.manufacturer.as_deref(), Some("Fake"));
    assert!(plain.last_auth().unwrap().starts_with("Basic "));
    assert_eq!(plain.requests("/redfish/v1/SessionService/Sessions"), 0);

    for status in [404, 405, 501] {
        let refusing = fake(FakeBmc::builder().session_refusal(status)).await;
        let (_p, bmc) = bmc_on(&refusing, settings());
        bmc.find_system(None).await.unwrap();
        bmc.find_system(None).await.unwrap();
        assert!(refusing.last_auth().unwrap().starts_with("Basic "));
        assert_eq!(
            refusing.requests("/redfish/v1/SessionService/Sessions"),
            1,
            "fallback cached ({status})"
        );
        assert_eq!(
            refusing.requests("/redfish/v1/"),
            1,
            "service root read once ({status})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_unauthorized_without_retries() {
    let with_sessions = fake(FakeBmc::builder().sessions(true)).await;
    let pool = Pool::new(settings()).unwrap();
    let bmc = pool.bmc(target(&with_sessions.base_url, "wrong-password"));
    let e = clean(bmc.find_system(None).await.unwrap_err());
    assert_eq!(e, Error::Unauthorized(401));
    assert!(!e.transient());
    assert_eq!(
        with_sessions.total_requests(),
        2,
        "service root + one session attempt"
    );

    let basic = fake(FakeBmc::builder()).await;
    let bmc = pool.bmc(target(&basic.base_url, "wrong-password"));
    assert_eq!(
        clean(bmc.systems().await.unwrap_err()),
        Error::Unauthorized(401)
    );
    assert_eq!(
        basic.total_requests(),
        2,
        "service root + the refused request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_with_backoff_and_bounded() {
    let fake = fake(FakeBmc::builder()).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    bmc.service_root().await.unwrap();

    // Two 503s then success: three requests.
    fake.push_fault(Some(&path), Fault::Status(503), 2);
    bmc.system(&path).await.unwrap();
    assert_eq!(fake.requests(&path), 3);

    // Always 500: exactly `attempts` requests, the last status returned, with backoff
    // (at most backoff_max per wait, so quick).
    fake.push_fault(Some(&path), Fault::Status(500), 3);
    let t = Instant::now();
    let e = clean(bmc.system(&path).await.unwrap_err());
    assert!(matches!(e, Error::Status { status: 500, .. }), "{e}");
    assert!(e.transient());
    assert_eq!(fake.requests(&path), 6);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // 4xx is not retried.
    fake.push_fault(Some(&path), Fault::Status(400), 1);
    assert!(matches!(
        clean(bmc.system(&path).await.unwrap_err()),
        Error::Status { status: 400, .. }
    ));
    assert_eq!(fake.requests(&path), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_up_to_backoff_max() {
    let fake = fake(FakeBmc::builder()).await;
    let path = fake.system_path(0);
    let s = Settings {
        backoff_max: Duration::from_secs(3),
        ..settings()
    };
    let (_p, bmc) = bmc_on(&fake, s);
    bmc.service_root().await.unwrap();
    fake.push_fault(Some(&path), Fault::StatusRetryAfter(429, 1), 1);
    let t = Instant::now();
    bmc.system(&path).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(fake.requests(&path), 2);

    // A Retry-After beyond backoff_max waits backoff_max only.
    let (_p, bmc) = bmc_on(&fake, settings());
    fake.push_fault(Some(&path), Fault::StatusRetryAfter(503, 60), 1);
    let t = Instant::now();
    bmc.system(&path).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "waited {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_bmc_times_out_and_an_absent_one_is_unreachable() {
    let fake = fake(FakeBmc::builder()).await;
    let s = Settings {
        timeout: Duration::from_millis(300),
        attempts: 2,
        ..settings()
    };
    let (_p, bmc) = bmc_on(&fake, s.clone());
    bmc.service_root().await.unwrap();
    fake.set_delay(Duration::from_secs(3));
    let t = Instant::now();
    let e = clean(bmc.systems().await.unwrap_err());
    assert_eq!(e, Error::Timeout(Duration::from_millis(300)));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(fake.requests("/redfish/v1/Systems"), 2, "one retry");

    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = Pool::new(s).unwrap();
    let bmc = pool.bmc(target(&format!("http://127.0.0.1:{port}"), PASSWORD));
    let e = clean(bmc.systems().await.unwrap_err());
    assert!(matches!(e, Error::Unreachable(_)), "{e}");
    assert_eq!(
        pool.stats(&format!("http://127.0.0.1:{port}")).requests,
        2,
        "one retry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_are_malformed_not_retried() {
    let fake = fake(FakeBmc::builder()).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    bmc.service_root().await.unwrap();
    fake.push_fault(Some(&path), Fault::Malformed, 1);
    let e = clean(bmc.system(&path).await.unwrap_err());
    assert!(matches!(e, Error::Malformed(_)), "{e}");
    assert_eq!(e.reason(), "MalformedResponse");
    fake.push_fault(Some(&path), Fault::Huge, 1);
    let e = clean(bmc.system(&path).await.unwrap_err());
    assert!(
        matches!(e, Error::Malformed(ref m) if m.contains("bytes")),
        "{e}"
    );
    assert_eq!(fake.requests(&path), 2);
    bmc.system(&path).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_sends_if_match_and_recovers_from_412_and_428() {
    let fake = fake(FakeBmc::builder().etag_required(true)).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    let o = BootOverride {
        target: BootTarget::Pxe,
        once: true,
        http_boot_uri: None,
        mode: None,
    };

    let s = bmc.system(&path).await.unwrap();
    assert_eq!(s.etag.as_deref(), Some("W/\"1\""));
    bmc.set_boot_override(&s, &o).await.unwrap();
    assert_eq!(fake.requests(&path), 2, "GET + one PATCH");
    let st = fake.state(0);
    assert_eq!(
        (st.boot_target.as_str(), st.boot_enabled.as_str()),
        ("Pxe", "Once")
    );

    // Stale ETag (the system changed since it was read): 412, re-read, PATCH again.
    fake.set_power(0, "On");
    let o = BootOverride {
        target: BootTarget::UefiHttp,
        once: true,
        http_boot_uri: Some("http://10.0.0.1/boot/m1.efi".into()),
        mode: Some("UEFI".into()),
    };
    bmc.set_boot_override(&s, &o).await.unwrap();
    assert_eq!(fake.requests(&path), 5, "PATCH 412, GET, PATCH");
    assert_eq!(
        fake.state(0).http_boot_uri.as_deref(),
        Some("http://10.0.0.1/boot/m1.efi")
    );

    // No ETag known: 428, re-read, PATCH with it.
    let no_tag = System {
        etag: None,
        ..s.clone()
    };
    bmc.set_boot_override(
        &no_tag,
        &BootOverride {
            target: BootTarget::Cd,
            ..o.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(fake.requests(&path), 8);
    assert_eq!(fake.state(0).boot_target, "Cd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_follow_task_monitors() {
    let ok = fake(FakeBmc::builder().tasks(3, TaskEnd::Completed)).await;
    let (_p, bmc) = bmc_on(&ok, settings());
    let s = bmc.system(&ok.system_path(0)).await.unwrap();
    bmc.reset(&s, ResetType::On).await.unwrap();
    assert_eq!(
        ok.state(0).power,
        "On",
        "the task completed before reset returned"
    );
    let monitor_polls: u64 = (1..10)
        .map(|i| ok.requests(&format!("/redfish/v1/TaskMonitors/{i}")))
        .sum();
    assert_eq!(monitor_polls, 4, "three Running, then Completed");

    let failing = fake(FakeBmc::builder().tasks(
        1,
        TaskEnd::Exception(format!("power supply fault ({PASSWORD})")),
    ))
    .await;
    let (_p, bmc) = bmc_on(&failing, settings());
    let s = bmc.system(&failing.system_path(0)).await.unwrap();
    let e = clean(bmc.reset(&s, ResetType::ForceRestart).await.unwrap_err());
    assert!(
        matches!(e, Error::TaskFailed(ref m) if m.contains("power supply fault")),
        "{e}"
    );
    assert_eq!(failing.state(0).power, "Off");

    let endless = fake(FakeBmc::builder().tasks(1_000_000, TaskEnd::Completed)).await;
    let (_p, bmc) = bmc_on(
        &endless,
        Settings {
            task_timeout: Duration::from_millis(700),
            ..settings()
        },
    );
    let s = bmc.system(&endless.system_path(0)).await.unwrap();
    let t = Instant::now();
    assert_eq!(
        clean(bmc.reset(&s, ResetType::On).await.unwrap_err()),
        Error::Timeout(Duration::from_millis(700))
    );
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_bmc_limit_is_never_exceeded() {
    let fake = fake(
        FakeBmc::builder()
            .systems(4)
            .delay(Duration::from_millis(40)),
    )
    .await;
    let s = Settings {
        per_bmc_concurrency: 2,
        global_concurrency: 64,
        ..settings()
    };
    let (pool, bmc) = bmc_on(&fake, s);
    let calls: Vec<_> = (0..30)
        .map(|i| {
            let b = bmc.clone();
            let p = fake.system_path(i % 4);
            tokio::spawn(async move { b.system(&p).await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(fake.max_concurrent(), 2, "server-side maximum");
    let stats = pool.stats(&fake.base_url);
    assert_eq!(stats.max_in_flight, 2);
    assert_eq!(stats.requests, 31, "service root + 30");
    assert_eq!(fake.total_requests(), 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limit_holds_across_bmcs() {
    // One server on four ports: four BMCs to the pool, one place that sees them all.
    let fake = fake(
        FakeBmc::builder()
            .systems(2)
            .listeners(4)
            .delay(Duration::from_millis(40)),
    )
    .await;
    let s = Settings {
        per_bmc_concurrency: 2,
        global_concurrency: 3,
        ..settings()
    };
    let pool = Pool::new(s).unwrap();
    let bmcs: Vec<Bmc> = fake
        .base_urls
        .iter()
        .map(|u| pool.bmc(target(u, PASSWORD)))
        .collect();
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let b = bmcs[i % 4].clone();
            let p = fake.system_path(i % 2);
            tokio::spawn(async move { b.system(&p).await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(
        fake.max_concurrent(),
        3,
        "server-side maximum over all four"
    );
    for u in &fake.base_urls {
        assert!(pool.stats(u).max_in_flight <= 2, "{u}: {:?}", pool.stats(u));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_boot_target_and_reset_type_send_nothing() {
    let fake = fake(FakeBmc::builder().boot_targets(&["Pxe", "Hdd"])).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    let s = bmc.system(&path).await.unwrap();
    let o = BootOverride {
        target: BootTarget::UefiHttp,
        once: true,
        http_boot_uri: Some("http://x/y".into()),
        mode: None,
    };
    let e = clean(bmc.set_boot_override(&s, &o).await.unwrap_err());
    assert!(
        matches!(e, Error::Unsupported(ref m) if m.contains("UefiHttp")),
        "{e}"
    );
    assert_eq!(e.reason(), "FeatureMissing");
    let limited = System {
        reset_types: vec!["On".into()],
        ..s.clone()
    };
    assert!(matches!(
        clean(
            bmc.reset(&limited, ResetType::PowerCycle)
                .await
                .unwrap_err()
        ),
        Error::Unsupported(_)
    ));
    assert_eq!(fake.requests(&path), 1, "only the GET");
    assert_eq!(fake.total_requests(), 2, "service root + GET");

    assert!(matches!(
        clean(bmc.find_system(Some("no-such-uuid")).await.unwrap_err()),
        Error::Unsupported(_)
    ));
    let two = self::fake(FakeBmc::builder().systems(2)).await;
    let (_p, bmc) = bmc_on(&two, settings());
    assert!(matches!(
        clean(bmc.find_system(None).await.unwrap_err()),
        Error::Unsupported(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_media_through_actions_or_patch() {
    for actions in [true, false] {
        let fake = fake(
            FakeBmc::builder()
                .systems(2)
                .media_actions(actions)
                .etag_required(!actions),
        )
        .await;
        let (_p, bmc) = bmc_on(&fake, settings());
        let s = bmc.system(&fake.system_path(1)).await.unwrap();
        assert_eq!(
            s.virtual_media.as_deref(),
            Some("/redfish/v1/Systems/2/VirtualMedia"),
            "the fake links each system's own media collection"
        );
        let m = bmc.manager(&s.managers[0]).await.unwrap();
        assert_eq!(m.firmware_version.as_deref(), Some("1.2.3"));
        let vms = bmc.virtual_media(&s).await.unwrap();
        assert_eq!(vms.len(), 1, "only the system's own device");
        let vm = &vms[0];
        assert_eq!(vm.media_types, ["CD", "DVD"]);
        assert_eq!(vm.insert_target.is_some(), actions);
        bmc.insert_media(vm, "http://10.0.0.1/boot/m2.iso")
            .await
            .unwrap();
        let st = fake.state(1);
        assert_eq!(
            (st.media_image.as_deref(), st.media_inserted),
            (Some("http://10.0.0.1/boot/m2.iso"), true),
            "actions {actions}"
        );
        let vm = bmc.virtual_media(&s).await.unwrap().remove(0);
        assert_eq!(
            (vm.image.as_deref(), vm.inserted),
            (Some("http://10.0.0.1/boot/m2.iso"), true)
        );
        bmc.eject_media(&vm).await.unwrap();
        let st = fake.state(1);
        assert_eq!((st.media_image, st.media_inserted), (None, false));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bmc_error_text_is_scrubbed_of_the_password() {
    // A BMC that echoes the password back in its error message.
    let fake = fake(FakeBmc::builder()).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    fake.push_fault(
        Some(&path),
        Fault::StatusMessage(400, format!("bad password {PASSWORD}")),
        1,
    );
    let e = clean(bmc.system(&path).await.unwrap_err());
    assert!(
        matches!(e, Error::Status { status: 400, ref message } if message.contains("<redacted>")),
        "{e}"
    );
    // The password is not in a target's Debug either.
    let t = target(&fake.base_url, PASSWORD);
    assert!(!format!("{t:?}").contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_state_is_what_the_bmc_reports_now() {
    let fake = fake(FakeBmc::builder().power_delay(Duration::from_millis(300))).await;
    let path = fake.system_path(0);
    let (_p, bmc) = bmc_on(&fake, settings());
    let s = bmc.system(&path).await.unwrap();
    assert_eq!(s.power_state, Some(PowerState::Off));
    bmc.reset(&s, ResetType::On).await.unwrap();
    assert_eq!(
        bmc.system(&path).await.unwrap().power_state,
        Some(PowerState::PoweringOn)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        bmc.system(&path).await.unwrap().power_state,
        Some(PowerState::On)
    );
    assert_eq!(fake.powered_on(), 1);
    // Changed behind the client's back (someone pressed the button).
    fake.set_power(0, "Off");
    assert_eq!(
        bmc.system(&path).await.unwrap().power_state,
        Some(PowerState::Off)
    );
}
