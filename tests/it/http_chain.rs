//! Follow the boot chain as iPXE does: fetch /boot.ipxe, substitute its variables, fetch
//! the per-machine script, then its kernel, initrd and Ignition, with the real curl from
//! the machine's address (127.0.0.2) and from another address (127.0.0.3).

use crate::support;

use bootplane::http::server::Limits;
use bootplane::http::BootEvent;
use support::http::*;

/// Expand the iPXE settings the chain line uses, as iPXE would for this machine.
fn expand(line: &str, uuid: &str) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    line.replace("${uuid}", &enc(uuid))
        .replace("${net0/mac:hexhyp}", "52-54-00-ab-cd-ef")
        .replace("${buildarch:uristring}", &enc("x86_64"))
        .replace("${platform:uristring}", &enc("pcbios"))
        // No DHCP reply here: option 224 (the script token) is unset, iPXE expands it empty.
        .replace("${224:uristring}", "")
}

fn chain_url(boot: &str) -> String {
    let line = boot
        .lines()
        .find(|l| l.starts_with("chain "))
        .expect("chain line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("chain url");
    assert!(!url.contains(' '));
    url.to_string()
}

fn word_after<'a>(script: &'a str, cmd: &str) -> &'a str {
    let line = script
        .lines()
        .find(|l| l.starts_with(cmd))
        .unwrap_or_else(|| panic!("no {cmd} in {script}"));
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
}

#[test]
fn chain_yields_kernel_initrd_ignition_for_the_machine_only() {
    let srv = start(Limits::default(), |_| {});
    srv.index.upsert(ready_machine(srv.dir.path(), &srv.base));

    let boot = curl(MACHINE_IP, &format!("{}/boot.ipxe", srv.base), &[]);
    assert_eq!(boot.code, 200);
    assert!(boot.text().starts_with("#!ipxe\n"));
    // Upper-case UUID: lookups are case-insensitive.
    let script_url = expand(&chain_url(&boot.text()), &UUID.to_uppercase());
    assert!(script_url.contains("uuid=4C4C4544%2D0042"), "{script_url}");

    // The generic chain carries no token: the claimed machine's script (which holds its
    // Ignition token) is refused there even from its own address (issue 32). Its DHCP
    // reply carries one (`signed_script_url` is the same token on the `server=` form).
    let generic = curl(MACHINE_IP, &script_url, &[]);
    assert_eq!(generic.code, 403, "{}", generic.text());
    let script = curl(MACHINE_IP, &srv.signed_script_url("server-a"), &[]);
    assert_eq!(script.code, 200, "{}", script.text());
    let s = script.text();
    assert!(s.starts_with("#!ipxe\n"), "{s}");
    let kernel_line = s.lines().find(|l| l.starts_with("kernel ")).unwrap();
    for arg in [
        "rd.neednet=1",
        "ignition.firstboot=1",
        "ignition.platform.id=metal",
        "console=ttyS0,115200",
    ] {
        assert!(
            kernel_line.split_whitespace().any(|w| w == arg),
            "{arg} missing: {kernel_line}"
        );
    }
    let kernel = word_after(&s, "kernel ");
    let initrd = word_after(&s, "initrd ");
    let ignition = kernel_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap();
    assert_eq!(
        kernel,
        format!("{}/assets/images/os-image/vmlinuz", srv.base)
    );
    assert_eq!(
        initrd,
        format!("{}/assets/images/os-image/initrd.img", srv.base)
    );
    assert!(
        ignition.starts_with(&format!("{}/ignition/server-a/", srv.base)),
        "{ignition}"
    );
    assert!(s.lines().any(|l| l == "boot"));

    // Every fetch succeeds from the machine's address.
    let k = curl(MACHINE_IP, kernel, &[]);
    assert_eq!((k.code, k.body.len(), k.redirects), (200, 70_000, 0));
    let i = curl(MACHINE_IP, initrd, &[]);
    assert_eq!((i.code, i.body.len()), (200, 90_000));
    let ig = curl(MACHINE_IP, ignition, &[]);
    assert_eq!((ig.code, ig.text().as_str()), (200, IGNITION));
    assert_eq!(
        ig.header("content-type").as_deref(),
        Some("application/json")
    );
    // With signed URLs the token is needed even from the machine's own address.
    let plain_ignition = format!("{}/ignition/server-a", srv.base);
    assert_eq!(curl(MACHINE_IP, &plain_ignition, &[]).code, 403);

    // From another address: the script and the Ignition are refused.
    let other = curl(OTHER_IP, &script_url, &[]);
    assert_eq!(other.code, 403);
    assert!(!other.text().contains("ignition"), "{}", other.text());
    assert_eq!(curl(OTHER_IP, &plain_ignition, &[]).code, 403);
    // Tampered token (expiry pushed out) and another machine's name: refused.
    let tok = ignition.rsplit('/').next().unwrap();
    let (_, sig) = tok.split_once('.').unwrap();
    assert_eq!(
        curl(
            OTHER_IP,
            &format!("{plain_ignition}/99999999999.{sig}"),
            &[]
        )
        .code,
        403
    );
    assert_eq!(
        curl(
            OTHER_IP,
            &format!("{}/ignition/server-b/{tok}", srv.base),
            &[]
        )
        .code,
        404
    );
    // The signed per-boot URL minted into the machine's script is the documented way in
    // from an unregistered address.
    assert_eq!(curl(OTHER_IP, ignition, &[]).code, 200);

    // Progress was recorded with the client's address, and counted.
    let ev = srv.index.events();
    assert!(ev.iter().any(|e| e.server == "server-a"
        && e.event == BootEvent::IpxeScriptFetched
        && e.client.to_string() == MACHINE_IP));
    assert!(ev.iter().any(|e| e.server == "server-a"
        && e.event == BootEvent::IgnitionDataFetched
        && e.client.to_string() == MACHINE_IP));
    let m = srv.metrics.encode();
    assert!(
        m.contains("bootplane_http_identity_refused_total{route=\"script\"} 2"),
        "{m}"
    );
    assert!(
        // The machine's own address without the token, another address with none, and
        // the tampered token (the other server's name is a 404 before any check).
        m.contains("bootplane_http_identity_refused_total{route=\"ignition\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("bootplane_http_boot_progress_total{event=\"IPXEScriptFetched\"} 1"),
        "{m}"
    );
}

#[test]
fn without_signed_urls_ignition_is_only_for_registered_addresses() {
    let srv = start(Limits::default(), |s| s.sign_ignition_urls = false);
    srv.index.upsert(ready_machine(srv.dir.path(), &srv.base));
    let script = curl(
        MACHINE_IP,
        &format!("{}/ipxe/script?mac=52-54-00-ab-cd-ef", srv.base),
        &[],
    );
    assert_eq!(script.code, 200);
    let s = script.text();
    let ignition = s
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap()
        .to_string();
    assert_eq!(ignition, format!("{}/ignition/server-a", srv.base));
    assert_eq!(curl(MACHINE_IP, &ignition, &[]).code, 200);
    assert_eq!(curl(OTHER_IP, &ignition, &[]).code, 403);
    assert_eq!(
        srv.index
            .events()
            .iter()
            .filter(|e| e.event == BootEvent::IgnitionDataFetched)
            .count(),
        1
    );
}

#[test]
fn unknown_and_unclaimed_machines_get_a_runnable_default_script() {
    let srv = start(Limits::default(), |s| {
        s.default_action = bootplane::ipxe::DefaultAction::Retry { secs: 3 }
    });
    let mut m = ready_machine(srv.dir.path(), &srv.base);
    m.state = bootplane::http::BootState::NotClaimed;
    srv.index.upsert(m);
    let unknown = curl(
        OTHER_IP,
        &format!(
            "{}/ipxe/script?uuid=00000000-0000-0000-0000-000000000009&mac=02-00-00-00-00-09",
            srv.base
        ),
        &[],
    );
    assert_eq!(unknown.code, 200);
    let t = unknown.text();
    assert!(
        t.starts_with("#!ipxe\n")
            && t.contains("sleep 3")
            && t.contains(&format!(
                "chain --autofree --replace {}/boot.ipxe",
                srv.base
            )),
        "{t}"
    );
    assert!(!t.contains("kernel"), "{t}");
    let unclaimed = curl(
        MACHINE_IP,
        &format!("{}/ipxe/script?uuid={UUID}", srv.base),
        &[],
    );
    assert_eq!(unclaimed.code, 200);
    assert!(
        unclaimed.text().contains("server-a is not claimed"),
        "{}",
        unclaimed.text()
    );
    // iPXE without SMBIOS UUID sends empty values: fall back to the MAC / address.
    let empty = curl(
        OTHER_IP,
        &format!(
            "{}/ipxe/script?uuid=&mac=&buildarch=x86_64&platform=efi",
            srv.base
        ),
        &[],
    );
    assert_eq!(empty.code, 200);
    assert!(
        empty.text().contains("unknown machine (address 127.0.0.3)"),
        "{}",
        empty.text()
    );
    assert!(srv.index.events().is_empty());
}
