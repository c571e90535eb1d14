//! The s390x flow's resources through the API and the CLI, without an NFS server:
//! the YAML examples apply, validation and defaults follow the CRDs, the comma list
//! of kinds works in `bootplane get`, and an Image says why it cannot be exported
//! when the export backend is disabled. Provisioning jobs are the controller's: the
//! job API refuses agents and operators, caller-chosen ids, and targets and sources
//! outside `[provision.jobs]`, so no job can stand in for a ServerAction's.

use crate::support;

use std::path::Path;

use serde_json::{json, Value};
use support::bootplane::Bootplane;

const API: &str = "/apis/provisioning.bootplane.dev/v1alpha1/namespaces/default";

#[test]
fn examples_apply_validation_defaults_and_cli() {
    let b = Bootplane::start(&[]);
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/s390x"));
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3);
    for f in &files {
        let (code, out, err) = b.cli(&["apply", "-f", f.to_str().unwrap()]);
        assert_eq!(code, 0, "{}: {out} {err}", f.display());
    }

    // Defaults from the CRD schema.
    let img = b.get(&format!("{API}/images/ubuntu-s390x"));
    assert_eq!(img["spec"]["zone"], "default");
    assert_eq!(img["spec"]["retentionPolicy"], "Retain");
    let rule = b.get(&format!("{API}/exportpolicyrules/ubuntu-s390x-admins"));
    assert_eq!(rule["spec"]["superuser"], false);

    // NFS disabled (the default): the Image says so; the spec still projects.
    b.wait_for(20, "image status", || {
        let i = b.get(&format!("{API}/images/ubuntu-s390x"));
        (i["status"]["state"] == "Failed").then_some(())
    });
    let i = b.get(&format!("{API}/images/ubuntu-s390x"));
    assert!(
        i["status"]["message"]
            .as_str()
            .unwrap()
            .contains("nfs.enabled"),
        "{i}"
    );
    let srv = b.wait_for(20, "projected server", || {
        let (c, v) = b.call("GET", &format!("{API}/baremetalservers/lpar-01"), None);
        (c == 200).then_some(v)
    });
    assert_eq!(
        srv["metadata"]["labels"]["provisioning.bootplane.dev/image-id"],
        "ubuntu-s390x"
    );
    assert_eq!(
        srv["spec"]["target"],
        "/var/tmp/bootplane-disks/lpar-01.img"
    );
    assert_eq!(
        srv["metadata"]["ownerReferences"][0]["kind"],
        "BareMetalSpec"
    );
    b.wait_for(20, "server waits for its image", || {
        let v = b.get(&format!("{API}/baremetalservers/lpar-01"));
        (v["status"]["state"] == "Pending"
            && v["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("waiting for Image ubuntu-s390x")))
        .then_some(())
    });
    b.wait_for(20, "spec projected", || {
        let v = b.get(&format!("{API}/baremetalspecs/lpar-01"));
        (v["status"]["state"] == "Projected").then_some(())
    });

    // Comma list of kinds, short names, plural.group.
    let (code, out, err) = b.cli(&[
        "get",
        "images,storagevolumes,exportpolicyrules,baremetalservers,serveractions",
    ]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "ubuntu-s390x",
        "ubuntu-s390x-admins",
        "10.20.0.0/24",
        "lpar-01",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    let (code, out, _) = b.cli(&["get", "bms,epr,img"]);
    assert_eq!(code, 0);
    assert!(out.contains("lpar-01") && out.contains("ubuntu-s390x-admins"));
    let (code, _, _) = b.cli(&["get", "images.provisioning.bootplane.dev"]);
    assert_eq!(code, 0);

    // Validation: bad checksum, source escaping the images dir, bad client, bad enum.
    let bad: [(&str, Value, &str); 5] = [
        (
            "images",
            json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "Image",
                   "metadata": {"name": "x"}, "spec": {"source": "a/b.img", "sha256": "xyz"}}),
            "spec.sha256",
        ),
        (
            "images",
            json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "Image",
                   "metadata": {"name": "x"}, "spec": {"source": "../etc/passwd", "sha256": "a".repeat(64)}}),
            "spec.source",
        ),
        (
            "exportpolicyrules",
            json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "ExportPolicyRule",
                   "metadata": {"name": "x"}, "spec": {"exportPolicyRef": {"name": "p"}, "index": 1, "client": "host.example"}}),
            "spec.client",
        ),
        (
            "exportpolicyrules",
            json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "ExportPolicyRule",
                   "metadata": {"name": "x"}, "spec": {"exportPolicyRef": {"name": "p"}, "index": 1, "client": "10.0.0.1", "access": "all"}}),
            "spec.access",
        ),
        (
            "serveractions",
            json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "ServerAction",
                   "metadata": {"name": "x"}, "spec": {"type": "Reboot", "serverRef": {"name": "s"}}}),
            "spec.type",
        ),
    ];
    for (plural, obj, field) in bad {
        let (code, v) = b.call("POST", &format!("{API}/{plural}"), Some(&obj));
        assert_eq!(code, 422, "{plural}: {v}");
        assert!(v.to_string().contains(field), "{field} not named in {v}");
    }
    // Image source is immutable once set.
    let (code, v) = b.call(
        "PATCH",
        &format!("{API}/images/ubuntu-s390x"),
        Some(&json!({"spec": {"source": "other/disk.img"}})),
    );
    assert_eq!(code, 422, "{v}");
}

const JOBS: &str = "/apis/bootplane.dev/v1alpha1/jobs";

/// POST a job with `token`: (status, body).
fn post_job(b: &Bootplane, token: &str, body: &Value) -> (u16, Value) {
    let r = b
        .agent
        .post(&format!("{}{JOBS}", b.api))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    match r {
        Ok(r) => (
            r.status(),
            serde_json::from_str(&r.into_string().unwrap()).unwrap(),
        ),
        Err(ureq::Error::Status(c, r)) => (
            c,
            serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null),
        ),
        Err(e) => panic!("POST {JOBS}: {e}"),
    }
}

/// The agent's job writing any file (review H1): 403 for the agent; for an admin, 422
/// for a target outside the allow-lists, a source from elsewhere, no pinned checksum or
/// a caller-chosen id, and nothing is written. A job squatting a waiting action's id is
/// refused, so the action never reports a job it did not start.
#[test]
fn jobs_are_the_controllers_not_the_apis() {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets");
    std::fs::create_dir(&targets).unwrap();
    let planted = tmp.path().join("planted");
    let b = Bootplane::start(&[
        "--set",
        &format!(
            "provision.jobs.target_dir={:?}",
            targets.display().to_string()
        ),
        "--set",
        "provision.jobs.sources=[\"http://127.0.0.1:9/images\"]",
    ]);
    let (code, out, err) = b.cli(&["token", "create", "a1", "--role", "agent"]);
    assert_eq!(code, 0, "{err}");
    let agent = out.trim().to_string();
    let sha = "ab".repeat(32);
    let job = |target: &Path, source: &str| json!({"server": "x", "source": source, "sha256": sha, "target": target.display().to_string()});
    let src = "http://127.0.0.1:9/images/p.zst";

    let (code, v) = post_job(&b, &agent, &job(&planted, src));
    assert_eq!(code, 403, "agent may not start jobs: {v}");
    let (code, v) = post_job(&b, &agent, &job(&targets.join("d.img"), src));
    assert_eq!(code, 403, "not even inside the allow-list: {v}");

    let admin = b.token.clone();
    let (code, v) = post_job(&b, &admin, &job(&planted, src));
    assert_eq!(code, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("target"), "{v}");
    let escape = targets.join("..").join("planted");
    let (code, v) = post_job(&b, &admin, &job(&escape, src));
    assert_eq!(code, 422, "{v}");
    std::os::unix::fs::symlink(tmp.path(), targets.join("out")).unwrap();
    let (code, v) = post_job(&b, &admin, &job(&targets.join("out/planted"), src));
    assert_eq!(code, 422, "symlink out of the directory: {v}");
    let local = tmp.path().join("p.zst").display().to_string();
    let (code, v) = post_job(&b, &admin, &job(&targets.join("d.img"), &local));
    assert_eq!(code, 422, "local source: {v}");
    assert!(v["error"].as_str().unwrap().contains("source"), "{v}");
    let (code, v) = post_job(
        &b,
        &admin,
        &job(&targets.join("d.img"), "http://10.9.9.9/p.zst"),
    );
    assert_eq!(code, 422, "source off the list: {v}");
    let mut unpinned = job(&targets.join("d.img"), src);
    unpinned.as_object_mut().unwrap().remove("sha256");
    let (code, v) = post_job(&b, &admin, &unpinned);
    assert_eq!(code, 422, "no sha256: {v}");

    // A ServerAction waits (NFS is disabled); a job posted under its UID is refused.
    let target = targets.join("lpar.img");
    let action = json!({"apiVersion": "provisioning.bootplane.dev/v1alpha1", "kind": "ServerAction",
        "metadata": {"name": "act1"},
        "spec": {"type": "Provision", "serverRef": {"name": "lpar"},
                 "nfs": {"server": "127.0.0.1", "export": "/images/default/x", "path": "disk.img"},
                 "sha256": sha, "target": target.display().to_string()}});
    let (code, v) = b.call("POST", &format!("{API}/serveractions"), Some(&action));
    assert_eq!(code, 201, "{v}");
    let uid = v["metadata"]["uid"].as_str().unwrap().to_string();
    b.wait_for(20, "action waits for NFS", || {
        let a = b.get(&format!("{API}/serveractions/act1"));
        a["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("waiting for the NFS server"))
            .then_some(())
    });
    let mut squat = job(&target, src);
    squat["id"] = json!(uid);
    let (code, v) = post_job(&b, &admin, &squat);
    assert_eq!(code, 422, "a caller-chosen id is refused: {v}");
    squat["id"] = json!(format!("{uid}-0000000000000000"));
    let (code, v) = post_job(&b, &admin, &squat);
    assert_eq!(code, 422, "{v}");
    let (code, v) = b.call("GET", JOBS, None);
    assert_eq!((code, v["items"].clone()), (200, json!([])), "{v}");
    let a = b.get(&format!("{API}/serveractions/act1"));
    assert_eq!(a["status"]["state"], "Pending", "{a}");
    assert!(a["status"].get("jobRef").is_none(), "{a}");

    assert!(!planted.exists() && !target.exists());
    assert_eq!(
        std::fs::read_dir(&targets).unwrap().count(),
        1,
        "only the link"
    );
}
