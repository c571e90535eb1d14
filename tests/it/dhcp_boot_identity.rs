//! DHCP leases feed the rest of the appliance: `bootplane get leases` lists what the
//! authoritative server handed out, and a machine registered only by its MAC gets, in
//! the DHCP reply to its iPXE (boot file `/boot.ipxe`, option 224), a token for its own
//! script and current boot, which `boot.ipxe` sends on: the only way to that script
//! (and the Ignition token in it) with signed URLs on. Its leased address, or a
//! registered one taken by another host, is not enough; a power cycle ends the tokens
//! of the boot before it. Real dhclient (sending iPXE's user class), real bootplane, in
//! namespaces the test makes.

use crate::support;

use std::time::Duration;

use sha2::{Digest, Sha256};
use support::dhcp::*;
use support::netns::*;
use support::process::*;
use support::require::*;

/// HTTP status of a GET from the client namespace, from a given source address.
fn curl_code(lab: &Lab, from: &str, url: &str) -> (u16, String) {
    let mut c = lab.client.cmd("curl");
    c.args([
        "-sS",
        "--interface",
        from,
        "--max-time",
        "10",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        url,
    ]);
    let out = run_bounded(c, 20);
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = t.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn leases_are_listed_and_a_leased_address_is_the_machines_identity() {
    require("dhclient");
    require("curl");
    let lab = Lab::new(44);
    // A private image catalog so the claimed machine's boot configuration goes Ready.
    let images = lab.path("images");
    std::fs::create_dir_all(images.join("os")).unwrap();
    let mut entries = String::new();
    for (role, body) in [("kernel", &b"k\n"[..]), ("initrd", &b"i\n"[..])] {
        std::fs::write(images.join("os").join(role), body).unwrap();
        entries.push_str(&format!(
            "{role} = {{ path = \"os/{role}\", sha256 = \"{}\" }}\n",
            hex::encode(Sha256::digest(body))
        ));
    }
    std::fs::write(
        images.join("catalog.toml"),
        format!("[[image]]\nref = \"os-image:latest\"\n{entries}"),
    )
    .unwrap();
    let config = format!(
        "[dhcp]\nlease_time_secs = 60\n[http]\npublic_url = \"http://{}:8080\"\n[boot]\nimages_dir = \"{}\"\n[controller]\npower_driver = \"test\"\n",
        lab.addr(1),
        images.display()
    );
    let range = format!("{}-{}", lab.addr(100), lab.addr(150));
    let _server = lab.start_bootplane(
        &config,
        &[
            "--dhcp-interface",
            "vs",
            "--dhcp-mode",
            "authoritative",
            "--dhcp-range",
            &range,
        ],
        "bootplane.log",
    );
    let mac = mac_of(&lab.client, "vc");

    // Register the machine by MAC only (no IP), claim it.
    let yaml = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: leased}}\nspec: {{systemUUID: 4c4c4544-0044-0044-0044-000000000044}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"{mac}\"}}]}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: leased-claim}}\n\
         spec: {{power: \"On\", image: \"os-image:latest\", serverRef: {{name: leased}}}}\n"
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
    assert!(out.status.success(), "{}", text(&out));
    wait_for(
        Duration::from_secs(20),
        || {
            text(&lab.cli(&["get", "sbc", "leased-claim", "-o", "json"], None))
                .contains("\"state\": \"Ready\"")
        },
        || {
            format!(
                "boot configuration not Ready: {}",
                read(&lab.path("bootplane.log"))
            )
        },
    );

    wait_for(
        Duration::from_secs(20),
        || {
            text(&lab.cli(&["get", "server", "leased", "-o", "json"], None))
                .contains("\"powerState\": \"On\"")
        },
        || {
            format!(
                "leased not powered on: {}",
                read(&lab.path("bootplane.log"))
            )
        },
    );

    // A real client takes a lease, as iPXE does (user class `iPXE`): its boot file is
    // the generic chain script, and option 224 a token for the machine's own script.
    let script = lab.client_script();
    let dhclient = |args: &[&str]| {
        let mut c = lab.client.cmd("dhclient");
        c.args(["-4", "-cf", lab.path("dhclient.conf").to_str().unwrap()])
            .args(["-lf", lab.path("dhclient.leases").to_str().unwrap()])
            .args(["-pf", lab.path("dhclient.pid").to_str().unwrap()])
            .args(["-sf", script.to_str().unwrap()])
            .args(args)
            .arg("vc");
        let out = run_bounded(c, 30);
        assert!(
            out.status.success(),
            "dhclient: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        lab.path("dhclient.conf"),
        "option bootplane-token code 224 = string;\nsend user-class \"iPXE\";\nalso request bootplane-token;\n",
    )
    .unwrap();
    dhclient(&["-1"]);
    let leased = lab.addr(100);
    assert!(
        lab.script_log().contains(&format!("BOUND {leased}")),
        "{}",
        lab.script_log()
    );
    // The boot file and the token of the newest lease in dhclient's lease file.
    let newest = |prefix: &str| -> String {
        let leases = read(&lab.path("dhclient.leases"));
        leases
            .lines()
            .filter_map(|l| l.trim().strip_prefix(prefix))
            .next_back()
            .and_then(|l| l.strip_suffix("\";"))
            .unwrap_or_else(|| panic!("no {prefix} in the lease:\n{leases}"))
            .to_string()
    };
    assert_eq!(
        newest("filename \""),
        format!("http://{}:8080/boot.ipxe", lab.addr(1))
    );
    // What boot.ipxe chains to, with iPXE's settings filled in (the token from option
    // 224).
    let chain = |token: &str| {
        format!(
            "http://{}:8080/ipxe/script?uuid=4c4c4544-0044-0044-0044-000000000044&mac={}&buildarch=x86_64&platform=pcbios&token={token}",
            lab.addr(1),
            mac.replace(':', "-")
        )
    };
    let signed = chain(&newest("option bootplane-token \""));

    // `bootplane get leases` shows it.
    let out = lab.cli(&["get", "leases"], None);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let row = t
        .lines()
        .find(|l| l.starts_with(&leased))
        .unwrap_or_else(|| panic!("no lease row in:\n{t}"));
    assert!(
        row.to_lowercase().contains(&mac.to_lowercase()) && row.contains("bound"),
        "{row}"
    );

    // Issue 32: the machine's script carries its Ignition token, so neither the leased
    // address nor another one on the link gets it without a token (a host leasing with
    // the machine's MAC would hold that address too); the boot file's token opens it.
    lab.client
        .ip(&["addr", "add", &format!("{}/24", lab.addr(77)), "dev", "vc"]);
    let url = format!(
        "http://{}:8080/ipxe/script?mac={}",
        lab.addr(1),
        mac.replace(':', "-")
    );
    for from in [leased.clone(), lab.addr(77)] {
        let (code, body) = curl_code(&lab, &from, &url);
        assert_eq!(code, 403, "script without a token from {from}: {body}");
    }
    // The token is bound to the address the DHCP reply leased: read off the segment
    // (replies to clients without an address are broadcast), it opens nothing from
    // another address on the link.
    let (code, _) = curl_code(&lab, &lab.addr(77), &signed);
    assert_eq!(
        code, 403,
        "the leased address's script token from another address"
    );
    let (code, body) = curl_code(&lab, &leased, &signed);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("kernel ") && l.contains("/assets/images/os/kernel")),
        "{body}"
    );
    let (code, _) = curl_code(
        &lab,
        &lab.addr(77),
        &format!("http://{}:8080/ignition/leased", lab.addr(1)),
    );
    assert!(
        code == 403 || code == 404,
        "ignition from an unleased address: {code}"
    );

    // Issue 32: the leased address is enough for the script, not for the Ignition (a
    // host leasing with the machine's MAC would hold it too): that needs the token the
    // script carries.
    let ign = format!("http://{}:8080/ignition/leased", lab.addr(1));
    let (code, _) = curl_code(&lab, &leased, &ign);
    assert_eq!(
        code, 403,
        "ignition from the leased address without the token"
    );
    let signed_ign = body
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap_or_else(|| panic!("no signed ignition URL in:\n{body}"))
        .to_string();
    let (code, _) = curl_code(&lab, &leased, &signed_ign);
    assert_eq!(code, 200, "ignition with the script's token");

    // A power cycle by the driver (the claim asks Off, then On): the tokens of the boot
    // before it are refused; the next DHCP reply carries a token for the new boot.
    let power = |p: &str| {
        let yaml = format!(
            "apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: leased-claim}}\n\
             spec: {{power: \"{p}\", image: \"os-image:latest\", serverRef: {{name: leased}}}}\n"
        );
        let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
        assert!(out.status.success(), "{}", text(&out));
        wait_for(
            Duration::from_secs(20),
            || {
                text(&lab.cli(&["get", "server", "leased", "-o", "json"], None))
                    .contains(&format!("\"powerState\": \"{p}\""))
            },
            || {
                format!(
                    "leased not powered {p}: {}",
                    read(&lab.path("bootplane.log"))
                )
            },
        );
    };
    power("Off");
    wait_for(
        Duration::from_secs(20),
        || curl_code(&lab, &leased, &signed).0 == 403,
        || {
            format!(
                "the script token outlived the power-off: {}",
                read(&lab.path("bootplane.log"))
            )
        },
    );
    power("On");
    let (code, _) = curl_code(&lab, &leased, &signed);
    assert_eq!(code, 403, "script token from before the power cycle");
    let (code, _) = curl_code(&lab, &leased, &signed_ign);
    assert_eq!(code, 403, "ignition token from before the power cycle");
    // The machine boots again: a new lease exchange, a new boot file.
    dhclient(&["-r"]);
    dhclient(&["-1"]);
    let again = chain(&newest("option bootplane-token \""));
    assert_ne!(again, signed);
    let bound = lab
        .script_log()
        .lines()
        .filter_map(|l| l.strip_prefix("BOUND "))
        .next_back()
        .unwrap()
        .to_string();
    let (code, body) = curl_code(&lab, &bound, &again);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("ignition.config.url="), "{body}");

    // A second namespace on the link takes a registered machine's address: without the
    // token, 403.
    let yaml = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: static}}\nspec: {{systemUUID: 4c4c4544-0044-0044-0044-000000000060}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"52:54:00:44:00:60\", ips: [\"{}\"]}}]}}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {{name: static-claim}}\n\
         spec: {{power: \"On\", image: \"os-image:latest\", serverRef: {{name: static}}}}\n",
        lab.addr(60)
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
    assert!(out.status.success(), "{}", text(&out));
    wait_for(
        Duration::from_secs(20),
        || {
            text(&lab.cli(&["get", "sbc", "static-claim", "-o", "json"], None))
                .contains("\"state\": \"Ready\"")
        },
        || {
            format!(
                "static-claim not Ready: {}",
                read(&lab.path("bootplane.log"))
            )
        },
    );
    let intruder = Netns::new("intruder");
    must(
        "ip",
        &[
            "link",
            "add",
            "vs2",
            "netns",
            &lab.server.name,
            "type",
            "veth",
            "peer",
            "name",
            "vi",
            "netns",
            &intruder.name,
        ],
    );
    lab.server.ip(&["link", "set", "vs2", "up"]);
    lab.server.ip(&[
        "route",
        "add",
        &format!("{}/32", lab.addr(60)),
        "dev",
        "vs2",
    ]);
    intruder.ip(&["addr", "add", &format!("{}/24", lab.addr(60)), "dev", "vi"]);
    intruder.ip(&["link", "set", "vi", "up"]);
    // Neither the Ignition nor the script that carries its token (by MAC, by the
    // address itself): the registered address is the intruder's now.
    for path in [
        "ignition/static",
        "ipxe/script?mac=52-54-00-44-00-60",
        "ipxe/script",
    ] {
        let mut c = intruder.cmd("curl");
        c.args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://{}:8080/{path}", lab.addr(1)),
        ]);
        let out = run_bounded(c, 20);
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            code,
            "403",
            "{path} to a taker of the registered address: {}",
            text(&out)
        );
    }
}
