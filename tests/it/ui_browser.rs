//! The web dashboard (`/ui/`, crates/api/src/ui) in Debian's headless Chromium, driven through
//! chromedriver (tests/support/webdriver.rs): sign in with the bootstrap token, see the
//! registered servers, apply a claim through the API and watch its row change without a
//! reload, play a machine's boot against the boot listener (curl from the machine's
//! address, as the storm harness's clients do) and see the machine page's timeline,
//! power-cycle through the page and see the Redfish power driver send the reset to a
//! fake BMC; then a viewer's session: no action buttons, no secrets, and a write with
//! its token refused (403). The static files' headers (CSP, cache, types) are checked
//! over the real listener. Screenshots go to target/ui-artifacts/ on failure.

use crate::support;

use std::path::PathBuf;

use serde_json::{json, Value};
use support::api::{claim, claims, server, server_at, SERVERS};
use support::bootplane::Bootplane;
use support::fakebmc::{uuid_of, FakeBmc};
use support::http::curl_get;
use support::webdriver::Browser;

const PASSWORD: &str = "Ui-test-BMC-pa55word";

fn artifacts() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("ui-artifacts")
}

/// Run `f` with the browser; on a panic save a screenshot named `name` first.
fn with_screenshot(br: &Browser, name: &str, f: impl FnOnce()) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let path = artifacts().join(format!("{name}.png"));
        br.screenshot(&path);
        eprintln!("screenshot: {}", path.display());
        std::panic::resume_unwind(p);
    }
}

fn sign_in(br: &Browser, b: &Bootplane, token: &str) {
    br.goto(&format!("{}/ui/", b.api));
    let input = br.wait(20, "sign-in form", |br| {
        br.exec(
            "return !document.getElementById('signin').hidden",
            json!([]),
        )
        .as_bool()
        .unwrap_or(false)
        .then(|| br.find("#token"))
        .flatten()
    });
    br.type_into(&input, token);
    br.click(&br.find("#signin-submit").unwrap());
    br.wait(20, "signed in", |br| {
        br.exec(
            "return document.getElementById('nav').hidden === false",
            json!([]),
        )
        .as_bool()
        .unwrap_or(false)
        .then_some(())
    });
}

/// The text of the Fleet row of `name` (empty when not rendered).
fn fleet_row(br: &Browser, name: &str) -> String {
    br.exec(
        "const r = document.querySelector(`#fleet-rows a.row[data-name=\"${arguments[0]}\"]`); \
         return r && !r.hidden ? [...r.children].map(c => c.textContent).join('|') : ''",
        json!([name]),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

fn text_of(br: &Browser, css: &str) -> String {
    br.exec(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''",
        json!([css]),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

#[test]
fn dashboard_in_headless_chromium() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(1)
            .credentials("admin", PASSWORD)
            .ignore_graceful(true)
            .start(),
    );
    let b = Bootplane::start(&[
        "--set",
        "power.redfish.poll_interval_secs=1",
        "--set",
        "power.redfish.timeout_secs=2",
    ]);

    // The static files: types, cache validation, a strict CSP, no auth needed.
    let r = b.agent.get(&format!("{}/ui/", b.api)).call().unwrap();
    assert_eq!(r.content_type(), "text/html");
    let csp = r.header("content-security-policy").unwrap().to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let etag = r.header("etag").unwrap().to_string();
    let r = b
        .agent
        .get(&format!("{}/ui/", b.api))
        .set("If-None-Match", &etag)
        .call()
        .unwrap();
    assert_eq!(r.status(), 304);
    let r = b.agent.get(&format!("{}/ui/app.js", b.api)).call().unwrap();
    assert_eq!(r.content_type(), "text/javascript");
    // Every embedded file: its type, no inline script or style, nothing from another
    // origin, no HTML built from strings.
    for name in bootplane::api::ui::asset_names() {
        let r = b.agent.get(&format!("{}/ui/{name}", b.api)).call().unwrap();
        assert!(r.header("content-security-policy").is_some(), "{name}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        let ct = r.content_type().to_string();
        let text = r.into_string().unwrap();
        match name.rsplit('.').next().unwrap() {
            "js" => assert_eq!(ct, "text/javascript", "{name}"),
            "css" => assert_eq!(ct, "text/css", "{name}"),
            "html" => {
                assert_eq!(ct, "text/html");
                assert!(
                    !text.contains("<script>") && !text.contains("<style"),
                    "inline in {name}"
                );
                assert!(
                    !text.contains(" style=") && !text.contains(" onclick="),
                    "inline in {name}"
                );
            }
            _ => {}
        }
        assert!(
            !text.contains("https://"),
            "{name} loads from another origin"
        );
        assert!(
            !text.contains("innerHTML") && !text.contains("eval("),
            "{name}"
        );
    }
    match b.agent.get(&format!("{}/ui/nope.js", b.api)).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("unknown asset: {other:?}"),
    }
    // The data is not: whoami and lists need credentials.
    match b.agent.get(&format!("{}/api/whoami", b.api)).call() {
        Err(ureq::Error::Status(401, _)) => {}
        other => panic!("whoami without credentials: {other:?}"),
    }

    // The fleet: a server behind the fake BMC, a machine that will boot, two more.
    support::api::add_bmc(&b, "bmc-a", &fake.base_url, PASSWORD);
    let s = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "rack-bmc"},
        "spec": {"systemUUID": uuid_of(0).to_lowercase(), "bmcRef": {"name": "bmc-a"}},
        "status": {"state": "Available", "powerState": "Off"},
    });
    assert_eq!(b.call("POST", SERVERS, Some(&s)).0, 201);
    let boot = server_at("boot-1", "52:54:00:42:24:01", "127.0.0.7");
    assert_eq!(b.call("POST", SERVERS, Some(&boot)).0, 201);
    for n in ["web-1", "web-2"] {
        let v = server(n, json!({"role": "web"}), "Recycle");
        assert_eq!(b.call("POST", SERVERS, Some(&v)).0, 201);
    }

    let br = Browser::start(1280, 900);
    with_screenshot(&br, "operator", || {
        sign_in(&br, &b, &b.token);
        assert!(text_of(&br, "#who").contains("admin"), "{}", br.body_text());
        for n in ["rack-bmc", "boot-1", "web-1", "web-2"] {
            br.wait(20, &format!("fleet row {n}"), |br| {
                fleet_row(br, n).contains("Available").then_some(())
            });
        }
        let n = b.get(SERVERS)["items"].as_array().unwrap().len();
        br.wait(20, "the total", |br| {
            (text_of(br, "#fleet-total") == format!("{n} servers")).then_some(())
        });
        assert!(
            text_of(&br, ".counts").contains("Available"),
            "{}",
            text_of(&br, ".counts")
        );
        // The label filter goes to the API (labelSelector) and narrows the rows.
        br.type_into(&br.find("#fleet-selector").unwrap(), "role=web");
        br.wait(20, "filtered to web", |br| {
            (text_of(br, "#fleet-total") == "2 servers").then_some(())
        });
        assert!(fleet_row(&br, "boot-1").is_empty());
        br.exec(
            "const i = document.getElementById('fleet-selector'); i.value = ''; \
             i.dispatchEvent(new Event('input'))",
            json!([]),
        );
        br.wait(20, "unfiltered", |br| {
            (text_of(br, "#fleet-total") == format!("{n} servers")).then_some(())
        });

        // A claim applied through the API shows up live: no reload of the page.
        br.exec("window.bootplaneTestMarker = 42", json!([]));
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "boot-1-ign"},
            "stringData": {"ignition": r#"{"ignition":{"version":"3.4.0"}}"#}});
        assert_eq!(
            b.call("POST", "/api/v1/namespaces/default/secrets", Some(&secret))
                .0,
            201
        );
        let mut c = claim("c1", None, Some("boot-1"));
        c["spec"]["ignitionSecretRef"] = json!({"name": "boot-1-ign"});
        assert_eq!(b.call("POST", &claims("default"), Some(&c)).0, 201);
        br.wait(30, "boot-1 reserved by c1", |br| {
            let r = fleet_row(br, "boot-1");
            (r.contains("Reserved") && r.contains("default/c1")).then_some(())
        });
        br.click(&br.find("nav a[href='#/claims']").unwrap());
        br.wait(30, "claim c1 Bound", |br| {
            text_of(br, "#claims").contains("Bound").then_some(())
        });
        assert_eq!(
            br.exec("return window.bootplaneTestMarker", json!([])),
            json!(42),
            "the page was reloaded"
        );

        // The machine boots: its script and Ignition, fetched from its own address.
        b.wait_for(30, "boot configuration Ready", || {
            (b.get(&format!("{}/c1", support::api::sbcs("default")))["status"]["state"] == "Ready")
                .then_some(())
        });
        br.exec("location.hash = '#/machine/boot-1'", json!([]));
        br.wait(20, "machine page", |br| {
            text_of(br, "#machine-state")
                .contains("Reserved")
                .then_some(())
        });
        let (code, script) = curl_get("127.0.0.7", &b.signed_script_url("boot-1"));
        assert_eq!(code, 200, "{script}");
        let url = script
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ignition.config.url="))
            .unwrap_or_else(|| panic!("no ignition url in {script}"))
            .to_string();
        let (code, ign) = curl_get("127.0.0.7", &url);
        assert_eq!(code, 200, "{ign}");
        let tl = br.wait(30, "timeline shows the boot", |br| {
            let t = text_of(br, "#timeline");
            (t.contains("IPXEScriptFetched") && t.contains("IgnitionDataFetched")).then_some(t)
        });
        assert!(tl.contains("Server registered"), "{tl}");
        // The boot side's Events arrive through the watch (no reload).
        let tl = br.wait(30, "timeline shows the boot side's events", |br| {
            let t = text_of(br, "#timeline");
            (t.contains("ScriptServed: iPXE script fetched by 127.0.0.7")
                && t.contains("IgnitionServed"))
            .then_some(t)
        });
        assert!(!tl.contains("Events are not available"), "{tl}");
        assert!(
            !br.body_text().contains("3.4.0"),
            "the page shows the Ignition secret's data"
        );

        // Power-cycle through the page: confirmed, then the Redfish driver resets.
        br.goto(&format!("{}/ui/#/machine/rack-bmc", b.api));
        let btn = br.wait(20, "power-cycle button", |br| br.find("#power-cycle"));
        let before = fake.state(0).resets.len();
        br.click(&btn);
        br.wait(10, "confirmation dialog", |br| {
            br.exec("return document.getElementById('confirm').open", json!([]))
                .as_bool()
                .unwrap_or(false)
                .then_some(())
        });
        // Cancel first: nothing happens.
        br.click(&br.find("#confirm-cancel").unwrap());
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(
            b.get(&format!("{SERVERS}/rack-bmc"))["metadata"]["annotations"]
                .get("bootplane.dev/reset-requested")
                .is_none(),
            "cancel still reset"
        );
        br.click(&br.find("#power-cycle").unwrap());
        br.wait(10, "dialog again", |br| {
            br.exec("return document.getElementById('confirm').open", json!([]))
                .as_bool()
                .unwrap_or(false)
                .then_some(())
        });
        br.click(&br.find("#confirm-ok").unwrap());
        b.wait_for(30, "the fake BMC got a reset", || {
            (fake.state(0).resets.len() > before).then_some(())
        });
        br.wait(30, "power shown On", |br| {
            text_of(br, "#machine-power")
                .starts_with("On")
                .then_some(())
        });
        // The reset is an Event on the machine's timeline.
        br.wait(30, "timeline shows the reset", |br| {
            text_of(br, "#timeline")
                .contains("PowerReady=False: redfish: asking the BMC to restart the server")
                .then_some(())
        });
    });

    // A viewer: sees the fleet, has no buttons, gets no secrets, and is refused writes.
    let (code, v) = b.call(
        "POST",
        "/apis/auth.bootplane.dev/v1alpha1/apitokens",
        Some(&json!({"metadata": {"name": "ui-viewer"}, "spec": {"role": "viewer"}})),
    );
    assert_eq!(code, 201, "{v}");
    let viewer = v["status"]["token"].as_str().unwrap().to_string();
    with_screenshot(&br, "viewer", || {
        br.click(&br.find("#signout").unwrap());
        sign_in(&br, &b, &viewer);
        let me: Value = br.exec_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/api/whoami', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('bootplane.token')}}) \
               .then(r => r.json()).then(done, e => done(String(e)))",
            json!([]),
        );
        assert_eq!(me["user"], "ui-viewer", "{me}");
        assert_eq!(me["resources"]["secrets"], json!([]), "{me}");
        assert_eq!(
            me["resources"]["servers"],
            json!(["get", "list", "watch"]),
            "{me}"
        );
        br.wait(20, "viewer sees the fleet", |br| {
            fleet_row(br, "rack-bmc").contains("rack-bmc").then_some(())
        });
        br.goto(&format!("{}/ui/#/machine/rack-bmc", b.api));
        br.wait(20, "machine page", |br| {
            (!text_of(br, "#machine-state").is_empty()).then_some(())
        });
        assert!(
            br.find("#power-cycle").is_none(),
            "a viewer sees power buttons"
        );
        assert!(br.find("#power-on").is_none());
        br.goto(&format!("{}/ui/#/machine/boot-1", b.api));
        br.wait(20, "boot-1 claim card", |br| {
            text_of(br, "#main").contains("default/c1").then_some(())
        });
        assert!(
            !br.body_text().contains("Delete claim"),
            "a viewer sees Delete"
        );
        br.goto(&format!("{}/ui/#/claims", b.api));
        br.wait(20, "claims", |br| {
            text_of(br, "#claims").contains("c1").then_some(())
        });
        assert!(!br.body_text().contains("Delete claim"));
        // Called anyway, from the page's own origin with the viewer's token: 403.
        let code = br.exec_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/apis/metal.ironcore.dev/v1alpha1/servers/rack-bmc', {method: 'PATCH', \
               headers: {Authorization: 'Bearer ' + sessionStorage.getItem('bootplane.token'), \
                         'Content-Type': 'application/merge-patch+json'}, \
               body: JSON.stringify({metadata: {annotations: {'bootplane.dev/reset-requested': 'x'}}})}) \
               .then(r => done(r.status), e => done(String(e)))",
            json!([]),
        );
        assert_eq!(code, json!(403));
        let code = br.exec_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/api/v1/namespaces/default/secrets/boot-1-ign', \
               {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('bootplane.token')}}) \
               .then(r => done(r.status), e => done(String(e)))",
            json!([]),
        );
        assert_eq!(code, json!(403));
    });
    // And straight from a client, outside the browser.
    match b
        .agent
        .request(
            "DELETE",
            &format!("{}/c1", b.api.clone() + &claims("default")),
        )
        .set("Authorization", &format!("Bearer {viewer}"))
        .call()
    {
        Err(ureq::Error::Status(403, _)) => {}
        other => panic!("viewer delete: {other:?}"),
    }
}

/// Narrow window: the page still works (one column of the fleet's essentials) and can
/// be driven with the keyboard alone.
#[test]
fn narrow_window_and_keyboard() {
    let b = Bootplane::start(&[]);
    for i in 0..50 {
        let v = server(&format!("n-{i:02}"), json!({}), "Recycle");
        assert_eq!(b.call("POST", SERVERS, Some(&v)).0, 201);
    }
    let br = Browser::start(400, 700);
    with_screenshot(&br, "narrow", || {
        sign_in(&br, &b, &b.token);
        br.wait(20, "rows", |br| {
            fleet_row(br, "n-00").contains("n-00").then_some(())
        });
        // No horizontal scrolling of the page at 400 px.
        let wide = br.exec(
            "return document.documentElement.scrollWidth > window.innerWidth + 1",
            json!([]),
        );
        assert_eq!(wide, json!(false), "page wider than the window");
        // Only the rows in view (plus a margin) are in the DOM.
        let rows = br.exec(
            "return [...document.querySelectorAll('#fleet-rows a.row')].filter(r => !r.hidden).length",
            json!([]),
        );
        assert!(rows.as_u64().unwrap() < 50, "{rows}");
        // Arrow keys move the focus down the grid (scrolling it); Enter opens the machine.
        let grid = br.find("#fleet-rows").unwrap();
        br.exec("document.getElementById('fleet-rows').focus()", json!([]));
        br.keys(&grid, &"\u{E015}".repeat(30));
        let focused = br.exec(
            "return document.activeElement.dataset.name || ''",
            json!([]),
        );
        assert_eq!(focused, json!("n-29"));
        let el = br.exec("return document.activeElement", json!([]));
        let id = el[support::webdriver::ELEMENT]
            .as_str()
            .unwrap()
            .to_string();
        br.keys(&id, "\u{E007}");
        br.wait(20, "machine page by keyboard", |br| {
            (text_of(br, "#machine-name") == "n-29").then_some(())
        });
    });
}
