//! The s390x flow's resources through the API and the CLI, without an NFS server:
//! the YAML examples apply, validation and defaults follow the CRDs, the comma list
//! of kinds works in `bootplane get`, and an Image says why it cannot be exported
//! when the export backend is disabled.

mod support;

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
    assert_eq!(srv["spec"]["target"], "/var/tmp/lpar-01.img");
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
