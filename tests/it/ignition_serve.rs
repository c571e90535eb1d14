//! Per-machine Ignition as bootplane serves it (bootplane runs as a process, the test
//! talks to its API and, with curl bound to the machine's registered loopback address,
//! to its boot listener):
//!
//! - the served config is the operator template filled with the machine's facts with
//!   the claim's secret merged on top, and it follows changes without a restart: a new
//!   secret revision, a changed Server label (a fact), and an edited template file
//!   (picked up by the template directory's mtime poll);
//! - `bootplane render ignition --server NAME` and `bootplane render ipxe --server NAME`
//!   print what the machine gets, through the authenticated API;
//! - a template that fails for a machine (undefined variable) or a label naming a
//!   missing template puts the ServerBootConfiguration into `Error` with the reason.

use crate::support;

use std::process::Command;

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;
use support::http::curl_get;

/// Decoded contents of the file at `path` in a served config (plain `data:,` URLs).
fn file(cfg: &Value, path: &str) -> Option<String> {
    let f = cfg["storage"]["files"]
        .as_array()?
        .iter()
        .find(|f| f["path"] == path)?;
    let src = f["contents"]["source"].as_str()?;
    let enc = src.strip_prefix("data:,")?;
    Some(
        percent_encoding::percent_decode_str(enc)
            .decode_utf8()
            .ok()?
            .into_owned(),
    )
}

const TEMPLATE_V1: &str = "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\"\n    - path: /etc/rack\n      contents:\n        inline: \"{{ labels.rack }}\"\n";

/// `bootplane render ... --api URL --state-dir DIR`: (exit code, stdout, stderr).
fn render(b: &Bootplane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("render")
        .args(args)
        .arg("--api")
        .arg(&b.api)
        .arg("--state-dir")
        .arg(&b.dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sbc_error(b: &Bootplane, claim: &str) -> Value {
    let path = format!("{}/{claim}", sbcs("default"));
    let s = b.wait_for(30, "boot configuration Error", || {
        let s = b.call("GET", &path, None).1;
        (s["status"]["state"] == "Error").then_some(s)
    });
    s["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone()
}

#[test]
fn served_config_follows_secret_facts_and_template_changes_and_render_cli_shows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let tdir = tmp.path().join("templates");
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::write(tdir.join("default.bu"), TEMPLATE_V1).unwrap();
    let tset = format!("boot.ignition_templates={:?}", tdir.display().to_string());
    let b = Bootplane::start(&["--set", &tset]);

    const IP: &str = "127.0.0.6";
    let mut srv = server("s1", json!({"rack": "r1"}), "Recycle");
    srv["status"]["networkInterfaces"] =
        json!([{"name": "eth0", "macAddress": "52:54:00:00:06:01", "ip": IP}]);
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let ign = |motd: &str| {
        format!(
            r#"{{"ignition":{{"version":"3.4.0"}},"storage":{{"files":[{{"path":"/etc/motd","contents":{{"source":"data:,{motd}"}}}}]}}}}"#
        )
    };
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1-ign"},
        "stringData": {"ignition": ign("v1")}});
    b.claim_ready_with_ignition("c1", "s1", &secret, 30);

    // As the machine does: its script (fetched with the script token of its DHCP reply) carries
    // the signed URL.
    let (_, url) = b.signed_script(IP, "s1", 30);
    let served = || -> Value {
        let (code, body) = curl_get(IP, &url);
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let cfg = served();
    assert_eq!(
        cfg["ignition"]["version"], "3.4.0",
        "newer of template/secret"
    );
    assert_eq!(file(&cfg, "/etc/hostname").as_deref(), Some("s1"));
    assert_eq!(file(&cfg, "/etc/rack").as_deref(), Some("r1"));
    assert_eq!(file(&cfg, "/etc/motd").as_deref(), Some("v1"));

    // The CLI prints exactly what the machine gets, through the API.
    let (code, out, err) = render(&b, &["ignition", "--server", "s1"]);
    assert_eq!(code, 0, "{err}");
    let (_, body) = curl_get(IP, &url);
    assert_eq!(out.trim_end(), body);
    let (code, out, err) = render(&b, &["ipxe", "--server", "s1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("#!ipxe"), "{out}");
    assert!(out.contains("/assets/images/os/kernel"), "{out}");
    assert!(out.contains("/ignition/s1/"), "signed ignition URL: {out}");
    let (code, _, err) = render(&b, &["ipxe", "--server", "nosuch"]);
    assert_eq!(code, 1);
    assert!(err.contains("NotFound") && err.contains("nosuch"), "{err}");
    // The preview endpoint needs the API token.
    let r = b
        .agent
        .get(&format!(
            "{}/apis/boot.bootplane.dev/v1alpha1/render/ignition/s1",
            b.api
        ))
        .call();
    assert!(matches!(r, Err(ureq::Error::Status(401, _))), "{r:?}");

    // A new secret revision re-renders (watch on Secrets).
    let (code, v) = b.call(
        "PATCH",
        "/api/v1/namespaces/default/secrets/s1-ign",
        Some(&json!({"stringData": {"ignition": ign("v2")}})),
    );
    assert_eq!(code, 200, "{v}");
    b.wait_for(20, "secret v2 served", || {
        (file(&served(), "/etc/motd").as_deref() == Some("v2")).then_some(())
    });
    // A changed fact (Server label) re-renders; the template sees the new value.
    let (code, v) = b.call(
        "PATCH",
        &format!("{SERVERS}/s1"),
        Some(&json!({"metadata": {"labels": {"rack": "r2", "bootplane.dev/hostname": "node-1"}}})),
    );
    assert_eq!(code, 200, "{v}");
    b.wait_for(20, "label change served", || {
        let c = served();
        (file(&c, "/etc/rack").as_deref() == Some("r2")
            && file(&c, "/etc/hostname").as_deref() == Some("node-1"))
        .then_some(())
    });
    // An edited template file is picked up without a restart (mtime poll).
    std::fs::write(
        tdir.join("default.bu"),
        format!("{TEMPLATE_V1}    - path: /etc/template-v2\n      contents:\n        inline: v2\n"),
    )
    .unwrap();
    b.wait_for(20, "edited template served", || {
        (file(&served(), "/etc/template-v2").as_deref() == Some("v2")).then_some(())
    });
    let cfg = served();
    assert_eq!(file(&cfg, "/etc/motd").as_deref(), Some("v2"));
    assert_eq!(file(&cfg, "/etc/rack").as_deref(), Some("r2"));
    assert!(
        b.log().contains("ignition templates changed, reloaded"),
        "{}",
        tail(&b.log(), 20)
    );
}

#[test]
fn template_errors_put_the_boot_configuration_in_error() {
    let tmp = tempfile::tempdir().unwrap();
    let tdir = tmp.path().join("templates");
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::write(tdir.join("default.bu"), TEMPLATE_V1).unwrap();
    let tset = format!("boot.ignition_templates={:?}", tdir.display().to_string());
    let b = Bootplane::start(&["--set", &tset]);

    // No `rack` label: the template's `{{ labels.rack }}` is undefined (strict mode).
    assert_eq!(
        b.call(
            "POST",
            SERVERS,
            Some(&server("norack", json!({}), "Recycle"))
        )
        .0,
        201
    );
    assert_eq!(
        b.call(
            "POST",
            &claims("default"),
            Some(&claim("c-norack", None, Some("norack")))
        )
        .0,
        201
    );
    let ready = sbc_error(&b, "c-norack");
    assert_eq!(ready["reason"], "TemplateError", "{ready}");
    let msg = ready["message"].as_str().unwrap();
    assert!(
        msg.contains("default.bu") && msg.contains("line 11"),
        "names the template and line: {msg}"
    );
    // The preview says why instead of printing a config.
    let (code, _, err) = render(&b, &["ignition", "--server", "norack"]);
    assert_eq!(code, 1);
    assert!(err.contains("NotClaimed") || err.contains("Error"), "{err}");

    // A label naming a template that does not exist.
    assert_eq!(
        b.call(
            "POST",
            SERVERS,
            Some(&server(
                "gpu-1",
                json!({"rack": "r1", "bootplane.dev/ignition-template": "gpu"}),
                "Recycle"
            ))
        )
        .0,
        201
    );
    assert_eq!(
        b.call(
            "POST",
            &claims("default"),
            Some(&claim("c-gpu", None, Some("gpu-1")))
        )
        .0,
        201
    );
    let ready = sbc_error(&b, "c-gpu");
    assert_eq!(ready["reason"], "IgnitionTemplateMissing", "{ready}");
    assert!(
        ready["message"].as_str().unwrap().contains("\"gpu\""),
        "{ready}"
    );
}
