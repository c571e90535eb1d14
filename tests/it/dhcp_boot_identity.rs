//! DHCP leases feed the rest of the appliance: `bootplane get leases` lists what the
//! authoritative server handed out, and a machine registered only by its MAC may fetch
//! its iPXE script from the address bootplane leased to it, while another address on
//! the same link is refused. Real dhclient, real bootplane, in namespaces the test makes.

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

    // A real client takes a lease.
    let script = lab.client_script();
    let mut c = lab.client.cmd("dhclient");
    c.args([
        "-4",
        "-1",
        "-lf",
        lab.path("dhclient.leases").to_str().unwrap(),
        "-pf",
        lab.path("dhclient.pid").to_str().unwrap(),
    ])
    .args(["-sf", script.to_str().unwrap(), "vc"]);
    let out = run_bounded(c, 30);
    assert!(
        out.status.success(),
        "dhclient: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leased = lab.addr(100);
    assert!(
        lab.script_log().contains(&format!("BOUND {leased}")),
        "{}",
        lab.script_log()
    );

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

    // The leased address is the machine's identity; another address on the link is not.
    lab.client
        .ip(&["addr", "add", &format!("{}/24", lab.addr(77)), "dev", "vc"]);
    let url = format!(
        "http://{}:8080/ipxe/script?mac={}",
        lab.addr(1),
        mac.replace(':', "-")
    );
    let (code, body) = curl_code(&lab, &leased, &url);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("kernel ") && l.contains("/assets/images/os/kernel")),
        "{body}"
    );
    let (code, _) = curl_code(&lab, &lab.addr(77), &url);
    assert!(
        code == 403 || code == 404,
        "script from an unleased address: {code}"
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
    let signed = body
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap_or_else(|| panic!("no signed ignition URL in:\n{body}"))
        .to_string();
    let (code, _) = curl_code(&lab, &leased, &signed);
    assert_ne!(code, 403, "ignition with the script's token");

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
    let mut c = intruder.cmd("curl");
    c.args([
        "-sS",
        "--max-time",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{}:8080/ignition/static", lab.addr(1)),
    ]);
    let out = run_bounded(c, 20);
    let code = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        code,
        "403",
        "ignition to a taker of the registered address: {}",
        text(&out)
    );
}
