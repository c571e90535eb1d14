//! kubectl habits of the CLI, driven through the real `bootplane` binary against a
//! served instance: `apply`'s three-way merge (a label edited out of the YAML goes
//! away), `apply --subresource=status` (a Released Server made Available), `patch`
//! (merge and JSON patch, also on status), `label`/`annotate` with and without
//! `--overwrite`, `edit` with `$EDITOR` a `sed` script, `delete` by several names, `-l`
//! and `-f`, and `get -o name|jsonpath|custom-columns`, `--sort-by`, `--show-labels`,
//! `--no-headers`, `get all`. Bad input fails with an error naming the bad piece and
//! changes nothing.

use crate::support;

use serde_json::{json, Value};

use support::api::{claim, claims, server, SERVERS};
use support::bootplane::Bootplane;

fn ok(r: (i32, String, String)) -> String {
    assert_eq!(r.0, 0, "stdout: {}\nstderr: {}", r.1, r.2);
    r.1
}

fn fails(r: (i32, String, String), want: &str) -> String {
    assert_ne!(r.0, 0, "expected a failure; stdout: {}", r.1);
    assert!(r.2.contains(want), "stderr lacks {want:?}: {}", r.2);
    r.2
}

fn server_yaml(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l = String::new();
    for (k, v) in labels {
        l.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    let labels = if l.is_empty() {
        String::new()
    } else {
        format!("  labels:\n{l}")
    };
    format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata:\n  name: {name}\n{labels}\
         spec:\n  systemUUID: 8a3c1d2e-0000-4000-8000-{:012x}\n",
        support::api::fxhash(name) & 0xffff_ffff_ffff
    )
}

fn get_server(b: &Bootplane, name: &str) -> Value {
    b.get(&format!("{SERVERS}/{name}"))
}

#[test]
fn apply_three_way_merge_removes_what_the_manifest_dropped() {
    let b = Bootplane::start(&[]);
    let y1 = server_yaml("tw-1", &[("role", "worker"), ("zone", "a")]);
    let out = ok(b.cli_stdin(&["apply", "-f", "-"], Some(&y1)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/tw-1 created");
    let s = get_server(&b, "tw-1");
    let last = s["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("last-applied recorded");
    assert!(last.contains("\"zone\":\"a\""), "{last}");

    // Re-applying the same manifest changes nothing.
    let out = ok(b.cli_stdin(&["apply", "-f", "-"], Some(&y1)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/tw-1 unchanged");

    // Someone else's label survives; the label edited out of the YAML goes.
    ok(b.cli(&["label", "server", "tw-1", "owner=ops"]));
    let y2 = server_yaml("tw-1", &[("role", "worker")]);
    let out = ok(b.cli_stdin(&["apply", "--dry-run=client", "-f", "-"], Some(&y2)));
    assert_eq!(
        out.trim(),
        "server.metal.ironcore.dev/tw-1 configured (dry run)"
    );
    assert_eq!(get_server(&b, "tw-1")["metadata"]["labels"]["zone"], "a");
    let out = ok(b.cli_stdin(&["apply", "-f", "-"], Some(&y2)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/tw-1 configured");
    let s = get_server(&b, "tw-1");
    assert_eq!(
        s["metadata"]["labels"],
        json!({"role": "worker", "owner": "ops"}),
        "{s}"
    );
    let out = ok(b.cli_stdin(&["apply", "-f", "-"], Some(&y2)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/tw-1 unchanged");
}

#[test]
fn apply_status_moves_a_released_server_to_available() {
    let b = Bootplane::start(&[]);
    let (c, v) = b.call("POST", SERVERS, Some(&server("rel-1", json!({}), "Retain")));
    assert_eq!(c, 201, "{v}");
    let (c, v) = b.call(
        "POST",
        &claims("default"),
        Some(&claim("claim-rel", None, Some("rel-1"))),
    );
    assert_eq!(c, 201, "{v}");
    let cpath = format!("{}/claim-rel", claims("default"));
    b.wait_for(20, "bound", || {
        (b.get(&cpath)["status"]["phase"] == "Bound").then_some(())
    });
    ok(b.cli(&["delete", "serverclaim", "claim-rel"]));
    b.wait_for(20, "released", || {
        (get_server(&b, "rel-1")["status"]["state"] == "Released").then_some(())
    });

    // A plain apply leaves status alone.
    let mut doc = get_server(&b, "rel-1");
    doc["status"]["state"] = json!("Available");
    let text = doc.to_string();
    let out = ok(b.cli_stdin(&["apply", "-f", "-"], Some(&text)));
    assert!(out.contains("server.metal.ironcore.dev/rel-1"), "{out}");
    assert_eq!(get_server(&b, "rel-1")["status"]["state"], "Released");

    let status = "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\n\
                  metadata: {name: rel-1}\nstatus: {state: Available}\n";
    let out = ok(b.cli_stdin(&["apply", "--subresource=status", "-f", "-"], Some(status)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/rel-1 configured");
    assert_eq!(get_server(&b, "rel-1")["status"]["state"], "Available");
    let out = ok(b.cli_stdin(&["apply", "--subresource=status", "-f", "-"], Some(status)));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/rel-1 unchanged");

    // A status for an object that does not exist is refused, naming it.
    let missing = status.replace("rel-1", "nope-1");
    fails(
        b.cli_stdin(
            &["apply", "--subresource=status", "-f", "-"],
            Some(&missing),
        ),
        "\"nope-1\" not found",
    );
}

#[test]
fn patch_merge_and_json_and_status() {
    let b = Bootplane::start(&[]);
    ok(b.cli_stdin(
        &["apply", "-f", "-"],
        Some(&server_yaml("p-1", &[("a", "1")])),
    ));
    let out = ok(b.cli(&[
        "patch",
        "server",
        "p-1",
        "-p",
        r#"{"metadata":{"labels":{"b":"2","a":null}}}"#,
    ]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/p-1 patched");
    assert_eq!(
        get_server(&b, "p-1")["metadata"]["labels"],
        json!({"b": "2"})
    );

    // YAML works too.
    ok(b.cli(&[
        "patch",
        "server",
        "p-1",
        "-p",
        "metadata: {labels: {c: '3'}}",
    ]));
    let out = ok(b.cli(&[
        "patch",
        "server",
        "p-1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/metadata/labels/c","value":"3"},
            {"op":"remove","path":"/metadata/labels/b"},
            {"op":"add","path":"/metadata/labels/d","value":"4"}]"#,
    ]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/p-1 patched");
    assert_eq!(
        get_server(&b, "p-1")["metadata"]["labels"],
        json!({"c": "3", "d": "4"})
    );

    // A JSON patch that fails part-way changes nothing, and says which op failed.
    let before = get_server(&b, "p-1");
    fails(
        b.cli(&[
            "patch",
            "server",
            "p-1",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/e","value":"5"},
                {"op":"remove","path":"/metadata/labels/zz"}]"#,
        ]),
        "json patch operation 1 (remove /metadata/labels/zz) failed",
    );
    fails(
        b.cli(&[
            "patch",
            "server",
            "p-1",
            "--type=json",
            "-p",
            r#"[{"op":"frob","path":"/a"}]"#,
        ]),
        "unknown op \"frob\"",
    );
    fails(
        b.cli(&["patch", "server", "p-1", "-p", "{\"a\": "]),
        "neither JSON nor YAML",
    );
    fails(
        b.cli(&["patch", "server", "p-1", "-p", "[1]"]),
        "a merge patch is a mapping",
    );
    assert_eq!(get_server(&b, "p-1"), before);

    // Status through the subresource, as a merge patch and as a JSON patch.
    ok(b.cli(&[
        "patch",
        "server",
        "p-1",
        "--subresource=status",
        "-p",
        r#"{"status":{"state":"Available","powerState":"Off"}}"#,
    ]));
    assert_eq!(get_server(&b, "p-1")["status"]["state"], "Available");
    ok(b.cli(&[
        "patch",
        "server",
        "p-1",
        "--subresource",
        "status",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/status/state","value":"Maintenance"}]"#,
    ]));
    assert_eq!(get_server(&b, "p-1")["status"]["state"], "Maintenance");
    let out = ok(b.cli(&["patch", "server", "p-1", "-p", "{}"]));
    assert_eq!(
        out.trim(),
        "server.metal.ironcore.dev/p-1 patched (no change)"
    );
}

#[test]
fn label_and_annotate_need_overwrite_to_change_a_value() {
    let b = Bootplane::start(&[]);
    ok(b.cli_stdin(&["apply", "-f", "-"], Some(&server_yaml("l-1", &[]))));
    let out = ok(b.cli(&["label", "server", "l-1", "role=worker", "zone=a"]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/l-1 labeled");
    fails(
        b.cli(&["label", "server", "l-1", "role=storage"]),
        "'role' already has a value (worker), and --overwrite is false",
    );
    assert_eq!(
        get_server(&b, "l-1")["metadata"]["labels"]["role"],
        "worker"
    );
    ok(b.cli(&[
        "label",
        "server",
        "l-1",
        "role=storage",
        "zone-",
        "--overwrite",
    ]));
    assert_eq!(
        get_server(&b, "l-1")["metadata"]["labels"],
        json!({"role": "storage"})
    );
    fails(
        b.cli(&["label", "server", "l-1", "bad key=1"]),
        "invalid label key \"bad key\"",
    );
    fails(
        b.cli(&["label", "server", "l-1", "justakey"]),
        "neither KEY=VALUE nor KEY-",
    );

    let out = ok(b.cli(&["annotate", "server", "l-1", "note=hello world"]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/l-1 annotated");
    fails(
        b.cli(&["annotate", "server", "l-1", "note=bye"]),
        "'note' already has a value (hello world), and --overwrite is false",
    );
    ok(b.cli(&["annotate", "--overwrite", "server", "l-1", "note=bye"]));
    assert_eq!(
        get_server(&b, "l-1")["metadata"]["annotations"]["note"],
        "bye"
    );
    ok(b.cli(&["annotate", "server", "l-1", "note-"]));
    assert!(get_server(&b, "l-1")["metadata"]["annotations"]
        .get("note")
        .is_none());
    fails(b.cli(&["label", "server", "missing-1", "a=b"]), "NotFound");
}

#[test]
fn edit_runs_the_editor_and_reports_errors() {
    let b = Bootplane::start(&[]);
    ok(b.cli_stdin(
        &["apply", "-f", "-"],
        Some(&server_yaml("e-1", &[("gone", "x")])),
    ));
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.to_string_lossy().into_owned()
    };
    // The label line goes; a new one comes.
    let drop_label = script("drop.sh", r#"sed -i 's/^    gone: x$/    kept: y/' "$1""#);
    let out = ok(b.cli_env(&["edit", "server", "e-1"], None, &[("EDITOR", &drop_label)]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/e-1 edited");
    assert_eq!(
        get_server(&b, "e-1")["metadata"]["labels"],
        json!({"kept": "y"})
    );

    // Someone else writes the object while the operator edits (a controller, another
    // operator): the edit is a patch of what the operator changed, so both stay.
    let concurrent = script(
        "concurrent.sh",
        &format!(
            "BOOTPLANE_CLIENT_CONFIG=/dev/null {bin} annotate server e-1 other=z --server {api} \
             --state-dir {dir} >/dev/null && sed -i 's/^    kept: y$/    kept: w/' \"$1\"",
            bin = support::bootplane::bin(),
            api = b.api,
            dir = b.dir.display(),
        ),
    );
    let out = ok(b.cli_env(&["edit", "server", "e-1"], None, &[("EDITOR", &concurrent)]));
    assert_eq!(out.trim(), "server.metal.ironcore.dev/e-1 edited");
    let s = get_server(&b, "e-1");
    assert_eq!(s["metadata"]["labels"], json!({"kept": "w"}), "{s}");
    assert_eq!(s["metadata"]["annotations"]["other"], "z", "{s}");

    // VISUAL when EDITOR is unset; no change is a cancel.
    let noop = script("noop.sh", "true");
    let out = ok(b.cli_env(
        &["edit", "server", "e-1"],
        None,
        &[("EDITOR", ""), ("VISUAL", &noop)],
    ));
    assert_eq!(out.trim(), "Edit cancelled, no changes made.");

    // An invalid edit: the file is re-opened with the error on top; the same text
    // again stops with the copy kept.
    let log = dir.path().join("seen");
    let bad = script(
        "bad.sh",
        &format!(
            r#"cat "$1" >> {log}; echo ---- >> {log}; sed -i 's/^  systemUUID: .*/  systemUUID: [nope/' "$1""#,
            log = log.display()
        ),
    );
    let before = get_server(&b, "e-1");
    let r = b.cli_env(&["edit", "server", "e-1"], None, &[("EDITOR", &bad)]);
    let err = fails(r, "a copy of your changes is in ");
    assert!(err.contains("line"), "the parse error names where: {err}");
    let copy = err.rsplit("is in ").next().unwrap().trim().to_string();
    let saved = std::fs::read_to_string(&copy).unwrap();
    assert!(saved.contains("systemUUID: [nope"), "{saved}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the copy may hold a Secret");
    let seen = std::fs::read_to_string(&log).unwrap();
    assert!(seen.contains("# The edit failed:"), "{seen}");
    std::fs::remove_file(&copy).unwrap();
    assert_eq!(get_server(&b, "e-1"), before);
}

#[test]
fn delete_by_names_selector_and_files() {
    let b = Bootplane::start(&[]);
    let mut all = String::new();
    for (n, role) in [
        ("d-1", "a"),
        ("d-2", "a"),
        ("d-3", "b"),
        ("d-4", "b"),
        ("d-5", "c"),
    ] {
        all.push_str(&server_yaml(n, &[("role", role)]));
        all.push_str("---\n");
    }
    ok(b.cli_stdin(&["apply", "-f", "-"], Some(&all)));

    let out = ok(b.cli(&["delete", "servers", "d-1", "d-2"]));
    assert_eq!(
        out,
        "servers.metal.ironcore.dev \"d-1\" deleted\nservers.metal.ironcore.dev \"d-2\" deleted\n"
    );
    let out = ok(b.cli(&["delete", "server", "-l", "role=b"]));
    assert!(
        out.contains("\"d-3\" deleted") && out.contains("\"d-4\" deleted"),
        "{out}"
    );
    let gone = |n: &str| b.call("GET", &format!("{SERVERS}/{n}"), None).0 == 404;
    b.wait_for(20, "d-1..d-4 gone", || {
        ["d-1", "d-2", "d-3", "d-4"]
            .iter()
            .all(|n| gone(n))
            .then_some(())
    });
    assert!(!gone("d-5"), "the selector spared role=c");

    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), server_yaml("d-5", &[])).unwrap();
    let f = file.path().to_str().unwrap();
    let out = ok(b.cli(&["delete", "-f", f]));
    assert_eq!(out.trim(), "servers.metal.ironcore.dev \"d-5\" deleted");
    b.wait_for(20, "d-5 gone", || gone("d-5").then_some(()));
    fails(b.cli(&["delete", "-f", f]), "NotFound");
    ok(b.cli(&["delete", "-f", f, "--ignore-not-found"]));
    fails(b.cli(&["delete", "server", "x", "-l", "a=b"]), "not both");
    fails(b.cli(&["delete", "server"]), "no object named");
    fails(b.cli(&["delete", "servers", "d-9"]), "NotFound");
    let out = ok(b.cli(&["delete", "servers", "d-9", "--ignore-not-found"]));
    assert_eq!(out, "");
}

#[test]
fn get_output_forms() {
    let b = Bootplane::start(&[]);
    let mut all = String::new();
    for (n, zone) in [("g-b", "2"), ("g-a", "3"), ("g-c", "1")] {
        all.push_str(&server_yaml(n, &[("zone", zone)]));
        all.push_str("---\n");
    }
    ok(b.cli_stdin(&["apply", "-f", "-"], Some(&all)));

    let out = ok(b.cli(&["get", "servers", "-o", "name"]));
    assert_eq!(
        out,
        "server.metal.ironcore.dev/g-a\nserver.metal.ironcore.dev/g-b\nserver.metal.ironcore.dev/g-c\n"
    );
    let out = ok(b.cli(&["get", "servers", "-o", "jsonpath={.items[*].metadata.name}"]));
    assert_eq!(out, "g-a g-b g-c");
    let out = ok(b.cli(&[
        "get",
        "servers",
        "--sort-by=.metadata.labels.zone",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.zone}{"\n"}{end}"#,
    ]));
    assert_eq!(out, "g-c=1\ng-b=2\ng-a=3\n");
    let out = ok(b.cli(&[
        "get",
        "server",
        "g-a",
        "-o",
        "jsonpath={.metadata.labels.zone}",
    ]));
    assert_eq!(out, "3");
    let out = ok(b.cli(&[
        "get",
        "servers",
        "--sort-by",
        "{.metadata.labels.zone}",
        "-o",
        "custom-columns=NAME:.metadata.name,ZONE:.metadata.labels.zone,X:.spec.nothing",
    ]));
    assert_eq!(
        out,
        "NAME   ZONE   X\ng-c    1      <none>\ng-b    2      <none>\ng-a    3      <none>\n"
    );
    let out = ok(b.cli(&[
        "get",
        "servers",
        "--no-headers",
        "-o",
        "custom-columns=N:.metadata.name",
    ]));
    assert_eq!(out, "g-a\ng-b\ng-c\n");
    let out = ok(b.cli(&["get", "servers", "--show-labels"]));
    let head = out.lines().next().unwrap();
    assert!(
        head.starts_with("NAME") && head.ends_with("LABELS"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("g-a") && l.ends_with("zone=3")),
        "{out}"
    );
    let out = ok(b.cli(&["get", "servers", "--no-headers"]));
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.starts_with("g-a"), "{out}");
    let out = ok(b.cli(&["get", "all"]));
    assert!(out.contains("server.metal.ironcore.dev/g-a"), "{out}");

    // Bad output options fail before anything is asked, naming the bad piece.
    fails(
        b.cli(&["get", "servers", "-o", "jsonpath={.items[x]}"]),
        "bad index [x]",
    );
    fails(
        b.cli(&["get", "servers", "-o", "jsonpath={.a"]),
        "unclosed '{'",
    );
    fails(
        b.cli(&["get", "servers", "-o", "custom-columns=NAME"]),
        "is not HEADER:JSONPATH",
    );
    fails(
        b.cli(&["get", "servers", "-o", "tabular"]),
        "unknown output format \"tabular\"",
    );
    fails(
        b.cli(&["get", "servers", "--sort-by", "{range .a}"]),
        "without {end}",
    );
}
