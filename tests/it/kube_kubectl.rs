//! The real kubectl against the real `bootplane serve`, over TLS with the state dir's CA
//! and the admin token, unchanged (issue 34): discovery (`version`, `api-versions`,
//! `api-resources`, aggregated for v1.32 and legacy for v1.20), server-side tables
//! (`get`, `-o wide`, `-A`, `-w`), `apply` (create, unchanged, configured), server-side
//! apply (conflicts, `--force-conflicts`, a field left out removed), `label`,
//! `annotate`, `patch --type merge`, `get -l`, `-o jsonpath`, `explain` from the OpenAPI v3
//! documents, `delete`, and the errors a real apiserver gives for a resource it does not
//! serve. Outputs are asserted line by line.

use crate::support;

use serde_json::json;

use support::bootplane::Bootplane;
use support::kube::{debian_kubectl, system_kubectl, Kubectl};

fn kubectl_for(b: &Bootplane, bin: &std::path::Path) -> Kubectl {
    Kubectl::new(bin, &b.api, &b.dir.join("tls/ca.crt"), &b.token)
}

/// The whitespace-separated cells of the line of `out` whose first cell is `first`.
fn row<'a>(out: &'a str, first: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&first))
        .unwrap_or_else(|| panic!("no line starting with {first:?} in\n{out}"))
}

/// The lines a running kubectl (a watch) prints, as they come.
fn lines_of(p: &mut support::process::Proc) -> std::sync::mpsc::Receiver<String> {
    let stdout = p.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for l in std::io::BufReader::new(stdout).lines() {
            if tx.send(l.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lines from `rx` up to the first for which `want` holds (30 s at most).
fn until(rx: &std::sync::mpsc::Receiver<String>, want: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen: Vec<String> = Vec::new();
    while !seen.last().is_some_and(|l| want(l)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("no such line from kubectl ({e}): {seen:?}"),
        }
    }
    seen
}

fn server_manifest(name: &str, uuid: &str) -> String {
    json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": name, "labels": {"rack": "r1"}},
        "spec": {"systemUUID": uuid},
    })
    .to_string()
}

/// What both kubectls must do the same way; `apply` takes `apply_flags` (none: v1.20
/// validates on its side from the OpenAPI v2 document, v1.32 leaves it to the server).
fn common(b: &Bootplane, k: &Kubectl, apply_flags: &[&str]) {
    let apply = |stdin: &str| {
        let mut a = vec!["apply", "-f", "-"];
        a.extend_from_slice(apply_flags);
        k.ok(&a, Some(stdin))
    };
    let versions = k.ok(&["api-versions"], None);
    let versions: Vec<&str> = versions.lines().collect();
    for want in [
        "v1",
        "metal.ironcore.dev/v1alpha1",
        "provisioning.bootplane.dev/v1alpha1",
        "auth.bootplane.dev/v1alpha1",
    ] {
        assert!(versions.contains(&want), "{want} not in {versions:?}");
    }

    let res = k.ok(&["api-resources"], None);
    let head = res.lines().next().unwrap();
    let cols: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(
        cols,
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"],
        "{res}"
    );
    assert_eq!(
        row(&res, "servers"),
        [
            "servers",
            "srv",
            "metal.ironcore.dev/v1alpha1",
            "false",
            "Server"
        ]
    );
    assert_eq!(
        row(&res, "serverclaims")[2..],
        ["metal.ironcore.dev/v1alpha1", "true", "ServerClaim"]
    );
    assert_eq!(row(&res, "secrets"), ["secrets", "v1", "true", "Secret"]);

    // Nothing yet: kubectl's own words for an empty list.
    let (code, out, err) = k.run(&["get", "servers"], None);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.contains("No resources found"), "{err}");

    let uuid = "2f8a7c39-1b6d-4e6a-9d3b-6f1e0c2a4b5d";
    let m = server_manifest("kube-a", uuid);
    let out = apply(&m);
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a created");
    let out = apply(&m);
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a unchanged");
    let changed = m.replace("\"r1\"", "\"r2\"");
    let out = apply(&changed);
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a configured");

    // The server's table: NAME and the CRD's columns, AGE last of the default ones.
    let out = k.ok(&["get", "servers"], None);
    let head: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        &head[..4],
        ["NAME", "SYSTEMUUID", "MANUFACTURER", "MODEL"],
        "{out}"
    );
    assert!(head.contains(&"AGE") && !head.contains(&"CLAIM"), "{out}");
    // Cells without a value are blank, as kubectl prints a CRD's.
    let cells = row(&out, "kube-a");
    assert_eq!(cells[1], uuid, "{out}");
    let age = cells.last().unwrap();
    assert!(age.ends_with('s') || age.ends_with('m'), "{out}");
    let wide = k.ok(&["get", "srv", "-o", "wide"], None);
    let head: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert!(head.contains(&"SKU") && head.contains(&"CLAIM"), "{wide}");

    let out = k.ok(
        &[
            "get",
            "server",
            "kube-a",
            "-o",
            "jsonpath={.spec.systemUUID}",
        ],
        None,
    );
    assert_eq!(out, uuid);
    let out = k.ok(&["label", "server", "kube-a", "env=lab"], None);
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a labeled");
    let out = k.ok(&["annotate", "server", "kube-a", "note=hello"], None);
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a annotated");
    let patch = r#"{"metadata":{"labels":{"env":"prod"}}}"#;
    let out = k.ok(
        &["patch", "server", "kube-a", "--type", "merge", "-p", patch],
        None,
    );
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a patched");
    let ops = r#"[{"op":"test","path":"/metadata/labels/env","value":"prod"},{"op":"add","path":"/metadata/labels/jp","value":"yes"}]"#;
    let out = k.ok(
        &["patch", "server", "kube-a", "--type", "json", "-p", ops],
        None,
    );
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a patched");
    let failing = r#"[{"op":"test","path":"/metadata/labels/env","value":"lab"},{"op":"add","path":"/metadata/labels/no","value":"x"}]"#;
    let (code, _, err) = k.run(
        &["patch", "server", "kube-a", "--type", "json", "-p", failing],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("operation 0 (test /metadata/labels/env)"),
        "{err}"
    );
    let out = k.ok(
        &[
            "get",
            "servers",
            "-l",
            "env=prod,rack=r2,jp=yes,!no",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-a");
    let out = k.ok(&["get", "servers", "-l", "env=lab", "-o", "name"], None);
    assert_eq!(out.trim(), "");
    let y = k.ok(&["get", "server", "kube-a", "-o", "yaml"], None);
    assert!(
        y.contains("note: hello") && y.contains("kind: Server"),
        "{y}"
    );
    // Every write is recorded as its manager's (kubectl names each command's), the fields
    // it changed taken from the others: the label's first writer lost its only field to
    // the patch, so its entry is gone.
    // (kubectl ≥ 1.21 leaves them out of its output unless asked; 1.20 shows them.)
    let modern = k.minor() >= 21;
    assert!(
        !modern || !y.contains("managedFields"),
        "kubectl leaves them out: {y}"
    );
    let mut get = vec!["get", "server", "kube-a", "-o", "json"];
    if modern {
        get.push("--show-managed-fields");
    }
    let full: serde_json::Value = serde_json::from_str(&k.ok(&get, None)).unwrap();
    let managers: Vec<String> = (full["metadata"]["managedFields"].as_array().unwrap().iter())
        .map(|e| {
            format!(
                "{}:{}",
                e["manager"].as_str().unwrap(),
                e["operation"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        managers,
        [
            "kubectl-client-side-apply:Update",
            "kubectl-annotate:Update",
            "kubectl-patch:Update"
        ],
        "{full:#}"
    );
    let patched = &full["metadata"]["managedFields"][2]["fieldsV1"]["f:metadata"];
    assert_eq!(patched, &json!({"f:labels": {"f:env": {}, "f:jp": {}}}));
    let (code, y, err) = b.cli(&["get", "server", "kube-a", "-o", "yaml"]);
    assert!(code == 0 && !y.contains("managedFields"), "{y}{err}");
    let (code, y, err) = b.cli(&[
        "get",
        "server",
        "kube-a",
        "-o",
        "yaml",
        "--show-managed-fields",
    ]);
    assert!(
        code == 0 && y.contains("manager: kubectl-annotate"),
        "{y}{err}"
    );

    // A namespaced kind across namespaces: kubectl adds NAMESPACE from each row's metadata.
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s1", "namespace": "default"}, "type": "Opaque",
        "data": {"k": "dg=="}})
    .to_string();
    let out = apply(&secret);
    assert_eq!(out.trim(), "secret/s1 created");
    let out = k.ok(&["get", "secrets", "-A"], None);
    let head: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&head[..3], ["NAMESPACE", "NAME", "TYPE"], "{out}");
    assert_eq!(
        &row(&out, "default")[..3],
        ["default", "s1", "Opaque"],
        "{out}"
    );

    // What a real apiserver says of a resource it does not serve.
    let (code, _, err) = k.run(&["get", "widgets"], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("the server doesn't have a resource type \"widgets\""),
        "{err}"
    );
    let (code, _, err) = k.run(&["get", "server", "nope"], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("servers.metal.ironcore.dev \"nope\" not found"),
        "{err}"
    );

    let out = k.ok(&["delete", "server", "kube-a"], None);
    assert_eq!(out.trim(), "server.metal.ironcore.dev \"kube-a\" deleted");
    let out = k.ok(&["delete", "secret", "s1"], None);
    assert_eq!(out.trim(), "secret \"s1\" deleted");
    let (_, out, err) = k.run(&["get", "servers"], None);
    assert!(
        out.is_empty() && err.contains("No resources found"),
        "{out}{err}"
    );
}

#[test]
fn kubectl_1_32_drives_bootplane_unchanged() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &system_kubectl());
    assert!(
        k.minor() >= 30,
        "this test wants a kubectl that asks for aggregated discovery"
    );
    let v: serde_json::Value =
        serde_json::from_str(&k.ok(&["version", "-o", "json"], None)).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1", "{v}");
    assert!(
        v["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap()
            .contains("+bootplane-"),
        "{v}"
    );
    common(&b, &k, &[]);
}

/// metal-operator's samples, pages, a claim's binding, its events and an edit (v1.32).
#[test]
fn kubectl_1_32_samples_pages_and_a_claim() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &system_kubectl());
    // metal-operator's samples, as its repository ships them, apply unchanged: created,
    // then unchanged; but for the two with `stringData`, which bootplane keeps as `data`
    // (sealed, as kube keeps a Secret's), so the second apply sends it again: configured
    // (what kubectl says of a Secret's `stringData` against a real apiserver too).
    let dir = support::data::fixtures().join("metal-operator");
    for f in [
        "metal_v1alpha1_bmcsecret.yaml",
        "metal_v1alpha1_bmc.yaml",
        "metal_v1alpha1_endpoint.yaml",
        "metal_v1alpha1_server.yaml",
        "ignition_secret.yaml",
        "metal_v1alpha1_serverclaim.yaml",
        "metal_v1alpha1_serverbootconfiguration.yaml",
    ] {
        let path = dir.join(f);
        let out = k.ok(&["apply", "-f", path.to_str().unwrap()], None);
        assert!(out.trim().ends_with(" created"), "{f}: {out}");
        let again = match std::fs::read_to_string(&path)
            .unwrap()
            .contains("stringData:")
        {
            true => " configured",
            false => " unchanged",
        };
        let out = k.ok(&["apply", "-f", path.to_str().unwrap()], None);
        assert!(out.trim().ends_with(again), "{f}: {out}");
    }
    let out = k.ok(&["get", "serverclaims", "-A", "-o", "name"], None);
    assert_eq!(out.lines().count(), 1, "{out}");

    // Pages: kubectl follows `continue` (--chunk-size, 500 by default) to the same list.
    let many: Vec<String> = (1..=5)
        .map(|i| {
            let uuid = format!("3c5d7e9f-1a2b-4c3d-8e4f-5a6b7c8d9e0{i}");
            server_manifest(&format!("kube-p{i}"), &uuid)
        })
        .collect();
    let list = many.join("\n");
    assert_eq!(k.ok(&["apply", "-f", "-"], Some(&list)).lines().count(), 5);
    // Only the five (rack=r1): servers the samples' BMC may bring are not counted.
    let whole = k.ok(&["get", "servers", "-l", "rack=r1", "-o", "name"], None);
    assert_eq!(whole.lines().count(), 5, "{whole}");
    assert_eq!(
        k.ok(
            &[
                "get",
                "servers",
                "-l",
                "rack=r1",
                "-o",
                "name",
                "--chunk-size=2"
            ],
            None
        ),
        whole
    );
    let page = b.get("/apis/metal.ironcore.dev/v1alpha1/servers?limit=2&labelSelector=rack%3Dr1");
    assert_eq!(page["items"].as_array().unwrap().len(), 2, "{page}");
    assert!(page["metadata"]["continue"].is_string(), "{page}");
    // With a selector the count of what is left is unknown (kube leaves it out too);
    // without, it is there (at least the three of the five not on the page: servers
    // the samples' BMC may bring between two lists are not counted on).
    assert!(
        page["metadata"].get("remainingItemCount").is_none(),
        "{page}"
    );
    let page = b.get("/apis/metal.ironcore.dev/v1alpha1/servers?limit=2");
    let left = page["metadata"]["remainingItemCount"].as_u64();
    assert!(left.is_some_and(|n| n >= 3), "{page}");
    k.ok(&["delete", "servers", "-l", "rack=r1"], None);

    // A claim binds: `get -w` shows its row turn Bound, `wait --for=jsonpath` returns,
    // and its events are listed by `--field-selector involvedObject.name=`.
    let free = support::api::server("kube-free", json!({"pool": "kube"}), "Recycle");
    let (code, body) = b.call("POST", support::api::SERVERS, Some(&free));
    assert_eq!(code, 201, "{body}");
    let mut w = k.spawn(&["get", "serverclaims", "-w"]);
    let lines = lines_of(&mut w);
    let claim = support::api::claim(
        "kube-claim",
        Some(json!({"matchLabels": {"pool": "kube"}})),
        None,
    );
    k.ok(&["apply", "-f", "-"], Some(&claim.to_string()));
    let out = k.ok(
        &[
            "wait",
            "serverclaim/kube-claim",
            "--for=jsonpath={.status.phase}=Bound",
            "--timeout=60s",
        ],
        None,
    );
    assert_eq!(
        out.trim(),
        "serverclaim.metal.ironcore.dev/kube-claim condition met"
    );
    let bound = until(&lines, |l| {
        l.starts_with("kube-claim ") && l.contains(" Bound ")
    });
    assert!(bound[0].starts_with("NAME "), "{bound:?}");
    drop(w);
    // The binding's event may be written just after the status that says Bound.
    let events = || {
        k.ok(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=kube-claim",
            ],
            None,
        )
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut ev = events();
    while ev.lines().count() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        ev = events();
    }
    assert!(ev.lines().count() >= 2, "no event of kube-claim: {ev}");
    assert!(ev.lines().skip(1).all(|l| l.contains("kube-claim")), "{ev}");
    // edit: the editor (a sed script) adds a label; kubectl sends the difference.
    let (_, out, err) = k.edit(
        &["serverclaim", "kube-claim"],
        "s/^  name: kube-claim$/  name: kube-claim\\n  labels:\\n    edited: \"yes\"/",
    );
    assert_eq!(
        out.trim(),
        "serverclaim.metal.ironcore.dev/kube-claim edited",
        "{err}"
    );
    let labels = k.ok(
        &[
            "get",
            "serverclaim",
            "kube-claim",
            "-o",
            "jsonpath={.metadata.labels.edited}",
        ],
        None,
    );
    assert_eq!(labels, "yes");
    k.ok(&["delete", "serverclaim", "kube-claim"], None);
}

/// Server-side apply with kubectl v1.32: conflicts, force, removal, malformed applies.
#[test]
fn kubectl_1_32_server_side_apply() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &system_kubectl());
    // Server-side apply: kubectl (manager "kubectl") makes a server; another manager
    // applying another UUID conflicts, naming the field and its manager, and changes
    // nothing; with --force-conflicts it takes the field over; kubectl applying again
    // without the label and the UUID removes the label, and leaves the UUID it no longer
    // owns.
    let ssa = |args: &[&str], m: &str| {
        let mut a = vec!["apply", "--server-side", "-f", "-"];
        a.extend_from_slice(args);
        k.run(&a, Some(m))
    };
    let s1 = server_manifest("kube-s", "7b3c1d2e-4f5a-4b6c-8d7e-9f0a1b2c3d4e");
    let (code, out, err) = ssa(&[], &s1);
    assert_eq!(
        (code, out.trim()),
        (0, "server.metal.ironcore.dev/kube-s serverside-applied"),
        "{err}"
    );
    let (code, out, err) = ssa(&[], &s1);
    assert_eq!(
        (code, out.trim()),
        (0, "server.metal.ironcore.dev/kube-s serverside-applied"),
        "{err}"
    );
    let s2 = server_manifest("kube-s", "7b3c1d2e-4f5a-4b6c-8d7e-9f0a1b2c3d4f")
        .replace(",\"labels\":{\"rack\":\"r1\"}", "");
    let (code, _, err) = ssa(&["--field-manager=flux"], &s2);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Apply failed with 1 conflict"), "{err}");
    assert!(
        err.contains("conflict with \"kubectl\": .spec.systemUUID"),
        "{err}"
    );
    let uuid_of = || {
        k.ok(
            &[
                "get",
                "server",
                "kube-s",
                "-o",
                "jsonpath={.spec.systemUUID}",
            ],
            None,
        )
    };
    assert_eq!(uuid_of(), "7b3c1d2e-4f5a-4b6c-8d7e-9f0a1b2c3d4e");
    let (code, _, err) = ssa(&["--field-manager=flux", "--force-conflicts"], &s2);
    assert_eq!(code, 0, "{err}");
    assert_eq!(uuid_of(), "7b3c1d2e-4f5a-4b6c-8d7e-9f0a1b2c3d4f");
    let managers = k.ok(
        &[
            "get",
            "server",
            "kube-s",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
        None,
    );
    assert_eq!(managers, "kubectl flux");
    let no_label = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "kube-s"}, "spec": {}})
    .to_string();
    assert!(!s2.contains("rack"), "{s2}");
    let (code, _, err) = ssa(&[], &no_label);
    assert_eq!(code, 0, "{err}");
    let labels = k.ok(
        &[
            "get",
            "server",
            "kube-s",
            "-o",
            "jsonpath={.metadata.labels}",
        ],
        None,
    );
    assert!(!labels.contains("rack"), "{labels}");
    assert_eq!(
        uuid_of(),
        "7b3c1d2e-4f5a-4b6c-8d7e-9f0a1b2c3d4f",
        "flux's field stays"
    );
    k.ok(&["delete", "server", "kube-s"], None);
    // Malformed applies: the Status a real apiserver gives, and nothing stored.
    let apply_raw = |query: &str, body: &str| {
        let path = format!("/apis/metal.ironcore.dev/v1alpha1/servers/kube-x{query}");
        match (b.req("PATCH", &path))
            .set("Content-Type", "application/apply-patch+yaml")
            .send_string(body)
        {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(c, _)) => c,
            Err(e) => panic!("{e}"),
        }
    };
    let good = "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: kube-x}\nspec: {systemUUID: 5d6e7f80-1a2b-4c3d-9e4f-5a6b7c8d9e0f}\n";
    assert_eq!(apply_raw("", good), 422, "no fieldManager");
    assert_eq!(apply_raw("?fieldManager=t", "metadata: x\n"), 422);
    assert_eq!(
        apply_raw("?fieldManager=t", "kind: Server\napiVersion: v9\n"),
        422
    );
    assert_eq!(apply_raw("?fieldManager=t", "{: ["), 400);
    assert_eq!(apply_raw("?fieldManager=t&force=maybe", good), 400);
    let (code, _, _) = k.run(&["get", "server", "kube-x"], None);
    assert_eq!(code, 1, "nothing stored");
    assert_eq!(apply_raw("?fieldManager=t", good), 201);
    k.ok(&["delete", "server", "kube-x"], None);
}

/// `explain`, `auth`, `get -w` and server-side validation with kubectl v1.32.
#[test]
fn kubectl_1_32_explain_auth_watch_and_validation() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &system_kubectl());
    // explain reads the OpenAPI v3 document of the group version.
    let out = k.ok(&["explain", "server.spec.bmcRef"], None);
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert!(lines.contains(&"GROUP:      metal.ironcore.dev"), "{out}");
    assert!(lines.contains(&"KIND:       Server"), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("FIELD: bmcRef <Object>")),
        "{out}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("name\t<string>")),
        "{out}"
    );

    // `auth can-i` and `auth whoami` answer from bootplane's roles.
    let token = |name: &str, role: &str| {
        let (code, out, err) = b.cli(&["token", "create", name, "--role", role]);
        assert_eq!(code, 0, "{err}");
        out.trim().to_string()
    };
    let viewer = k.with_token(&token("kube-viewer", "viewer"));
    let agent = k.with_token(&token("kube-agent", "agent"));
    let can = |k: &Kubectl, args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        let (code, out, err) = k.run(&a, None);
        match (code, out.trim()) {
            (0, "yes") => true,
            (1, "no") => false,
            _ => panic!("kubectl {a:?}: {code} {out} {err}"),
        }
    };
    assert!(can(&k, &["delete", "servers"]));
    assert!(can(&viewer, &["list", "servers"]));
    assert!(!can(&viewer, &["delete", "servers"]));
    assert!(!can(&viewer, &["get", "secrets"]));
    assert!(can(
        &agent,
        &["patch", "serveractions", "--subresource=status"]
    ));
    assert!(!can(&agent, &["patch", "servers", "--subresource=status"]));
    assert!(!can(&agent, &["create", "secrets"]));
    let list = viewer.ok(&["auth", "can-i", "--list"], None);
    let line = (list.lines())
        .find(|l| l.starts_with("servers.metal.ironcore.dev "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(line.trim_end().ends_with("[get list watch]"), "{list}");
    assert!(!list.lines().any(|l| l.starts_with("secrets ")), "{list}");
    let who = viewer.ok(&["auth", "whoami"], None);
    assert_eq!(row(&who, "Username"), ["Username", "kube-viewer"], "{who}");
    assert_eq!(row(&who, "Groups"), ["Groups", "[viewer]"], "{who}");

    // `get -w`: the watch's events come as one-row tables; a server created meanwhile
    // shows up as a row of its own.
    let mut w = k.spawn(&["get", "servers", "-w"]);
    let lines = lines_of(&mut w);
    // Created before the watch has listed or after, the server is a row either way (in
    // the list or as an event).
    let m = server_manifest("kube-w", "2f8a7c39-1b6d-4e6a-9d3b-6f1e0c2a4b5f");
    k.ok(&["apply", "-f", "-"], Some(&m));
    let seen = until(&lines, |l| l.starts_with("kube-w "));
    assert!(seen[0].starts_with("NAME "), "{seen:?}");
    drop(w);
    k.ok(&["delete", "server", "kube-w"], None);

    // A manifest with a field the CRD does not have is refused by the server (kubectl
    // leaves validation to it: the PATCH operations take fieldValidation), nothing stored.
    let bad = server_manifest("kube-b", "2f8a7c39-1b6d-4e6a-9d3b-6f1e0c2a4b5e")
        .replace("\"spec\":{", "\"spec\":{\"colour\":\"red\",");
    let (code, _, err) = k.run(&["apply", "-f", "-"], Some(&bad));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("colour"), "{err}");
    let (code, _, err) = k.run(&["get", "server", "kube-b"], None);
    assert!(code == 1 && err.contains("\"kube-b\" not found"), "{err}");
}

#[test]
fn debian_kubectl_1_20_drives_bootplane_unchanged() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &debian_kubectl());
    assert_eq!(k.minor(), 20);
    // v1.20 validates on its side, from the OpenAPI v2 document as protobuf.
    common(&b, &k, &[]);
    let bad = server_manifest("kube-v", "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b")
        .replace("systemUUID", "systemUUUID");
    let (code, _, err) = k.run(&["apply", "-f", "-"], Some(&bad));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("error validating data"), "{err}");
    assert!(err.contains("unknown field \"systemUUUID\""), "{err}");
    let (code, _, _) = k.run(&["get", "server", "kube-v"], None);
    assert_eq!(code, 1, "nothing stored");
    // explain from the same document.
    let out = k.ok(&["explain", "server.spec.bmcRef"], None);
    let words: Vec<String> = (out.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for want in [
        "KIND: Server",
        "VERSION: metal.ironcore.dev/v1alpha1",
        "RESOURCE: bmcRef <Object>",
        "name <string>",
    ] {
        assert!(words.iter().any(|w| w == want), "{want:?} not in\n{out}");
    }
}

/// `bootplane crds`: the CRD of every kind served from one, metal-operator's as
/// embedded, each a document of its own.
#[test]
fn crds_prints_every_served_crd() {
    let out = std::process::Command::new(support::bootplane::bin())
        .arg("crds")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = text
        .split("\n---\n")
        .map(|d| serde_norway::from_str(d.trim_start_matches("---\n")).unwrap())
        .collect();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| {
            assert_eq!(d["kind"], "CustomResourceDefinition", "{d}");
            d["metadata"]["name"].as_str().unwrap()
        })
        .collect();
    let served: Vec<String> = bootplane::model::registry::Registry::global()
        .types
        .iter()
        .filter(|t| t.crd.is_some())
        .map(|t| t.qualified())
        .collect();
    assert_eq!(names, served.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(names.contains(&"servers.metal.ironcore.dev"), "{names:?}");
    assert!(
        names.contains(&"images.provisioning.bootplane.dev"),
        "{names:?}"
    );
    let reference = include_str!("../../crates/model/src/crds/metal.ironcore.dev_servers.yaml");
    assert!(
        text.contains(reference.trim_start_matches("---\n")),
        "metal-operator's CRD as embedded"
    );
}

/// `kubectl diff` (client-side and `--server-side`) and `--dry-run=server` with kubectl
/// v1.32: the changes shown line by line from bootplane's dry-run answers, and nothing
/// stored by any of them.
#[test]
fn kubectl_1_32_diff_and_server_dry_run() {
    let b = Bootplane::start(&[]);
    let k = kubectl_for(&b, &system_kubectl());
    let rev = || {
        let r = (b.req("GET", "/apis/metal.ironcore.dev/v1alpha1/servers")).call();
        let v: serde_json::Value =
            serde_json::from_str(&r.unwrap().into_string().unwrap()).unwrap();
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let diffs = |out: &str| -> Vec<String> {
        (out.lines())
            .filter(|l| l.starts_with(['+', '-']) && !l.starts_with("+++") && !l.starts_with("---"))
            .filter(|l| !l.contains("generation:") && !l.contains("resourceVersion:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    let a = server_manifest("kube-d", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
    let before = rev();
    // A new object: diff shows all of it (exit 1: differences), the dry-run create
    // answers as a create would; neither stores it.
    let (code, out, err) = k.run(&["diff", "-f", "-"], Some(&a));
    assert_eq!(code, 1, "{out}{err}");
    let d = diffs(&out);
    for want in [
        "+ name: kube-d",
        "+ systemUUID: 1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
        "+ rack: r1",
    ] {
        assert!(d.iter().any(|l| l == want), "{want:?} not in {d:?}\n{out}");
    }
    assert!(d.iter().all(|l| l.starts_with('+')), "{d:?}");
    let out = k.ok(&["apply", "--dry-run=server", "-f", "-"], Some(&a));
    assert_eq!(
        out.trim(),
        "server.metal.ironcore.dev/kube-d created (server dry run)"
    );
    let (code, _, err) = k.run(&["get", "server", "kube-d"], None);
    assert_eq!(code, 1, "nothing stored: {err}");
    assert_eq!(rev(), before, "no write at all");
    k.ok(&["apply", "-f", "-"], Some(&a));
    // No change: no difference (exit 0, nothing printed).
    let (code, out, err) = k.run(&["diff", "-f", "-"], Some(&a));
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    // A changed UUID and label: exactly those lines, client-side (a merge patch tried
    // with dryRun=All) and server-side (an apply tried with dryRun=All).
    let changed = server_manifest("kube-d", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5e")
        .replace("\"r1\"", "\"r2\"");
    let stored = rev();
    for flags in [&[][..], &["--server-side", "--force-conflicts"][..]] {
        let mut args = vec!["diff", "-f", "-"];
        args.extend_from_slice(flags);
        let (code, out, err) = k.run(&args, Some(&changed));
        assert_eq!(code, 1, "{flags:?}: {out}{err}");
        let mut d = diffs(&out);
        d.sort();
        assert_eq!(
            d,
            [
                "+ rack: r2",
                "+ systemUUID: 1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5e",
                "- rack: r1",
                "- systemUUID: 1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
            ],
            "{flags:?}\n{out}"
        );
    }
    let out = k.ok(&["delete", "server", "kube-d", "--dry-run=server"], None);
    assert_eq!(
        out.trim(),
        "server.metal.ironcore.dev \"kube-d\" deleted (server dry run)"
    );
    let out = k.ok(
        &[
            "patch",
            "server",
            "kube-d",
            "--dry-run=server",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/spec/power","value":"On"}]"#,
        ],
        None,
    );
    // (kubectl v1.32's `patch` prints no dry-run suffix.)
    assert_eq!(out.trim(), "server.metal.ironcore.dev/kube-d patched");
    // Orphaning dependents is refused (bootplane removes them with their owner), not
    // ignored; the object stays.
    let (code, _, err) = k.run(&["delete", "server", "kube-d", "--cascade=orphan"], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Unsupported value: \"Orphan\""), "{err}");
    assert_eq!(
        rev(),
        stored,
        "the diffs, dry runs and refusals wrote nothing"
    );
    let uuid = k.ok(
        &[
            "get",
            "server",
            "kube-d",
            "-o",
            "jsonpath={.spec.systemUUID}",
        ],
        None,
    );
    assert_eq!(uuid, "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
    // Bad input: a dryRun value kube does not know is 400, as kube's; a token cannot
    // be issued as a trial.
    let status = |method: &str, path: &str, body: &str| match b
        .req(method, path)
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(c, _)) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        status(
            "DELETE",
            "/apis/metal.ironcore.dev/v1alpha1/servers/kube-d?dryRun=Some",
            ""
        ),
        400
    );
    assert_eq!(
        status(
            "POST",
            "/apis/auth.bootplane.dev/v1alpha1/apitokens?dryRun=All",
            "{}"
        ),
        400
    );
    assert_eq!(rev(), stored);
}
