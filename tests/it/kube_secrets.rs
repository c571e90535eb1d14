//! Core `v1` Secrets with kubectl v1.32 against the real `bootplane serve` (issue 34): the
//! commands that use client-go's typed client or kubectl's built-in strategies for them,
//! unchanged: `create secret generic` (a protobuf body), `apply` twice (the second a
//! strategic merge patch), `patch` (strategic by default), `edit`, `label`, and a kind
//! bootplane does not serve (404, as kube's for an unknown resource). Outputs asserted
//! line by line; a malformed strategic patch changes nothing.

use crate::support;

use support::bootplane::Bootplane;
use support::kube::{system_kubectl, Kubectl};

/// `data` rather than `stringData`, which is not stored (it becomes `data`): with it
/// every apply is a change, against kube as here.
fn secret(labels: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: kube-s1\n  namespace: default\n  labels: {{{labels}}}\ndata:\n  a: {value}\n"
    )
}

#[test]
fn kubectl_1_32_secrets_protobuf_and_strategic_patches() {
    let b = Bootplane::start(&[]);
    let k = Kubectl::new(
        &system_kubectl(),
        &b.api,
        &b.dir.join("tls/ca.crt"),
        &b.token,
    );
    let get = |what: &str| {
        let path = format!("jsonpath={what}");
        k.ok(&["get", "secret", "kube-s1", "-o", &path], None)
    };

    // create secret generic: the typed client sends protobuf.
    let out = k.ok(
        &[
            "create",
            "secret",
            "generic",
            "kube-s2",
            "--from-literal=k=v",
        ],
        None,
    );
    assert_eq!(out.trim(), "secret/kube-s2 created");
    let data = k.ok(
        &["get", "secret", "kube-s2", "-o", "jsonpath={.data.k}"],
        None,
    );
    assert_eq!(data, "dg==");
    let (code, _, err) = k.run(
        &[
            "create",
            "secret",
            "generic",
            "kube-s2",
            "--from-literal=k=w",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("secrets \"kube-s2\" already exists"), "{err}");

    // apply, then apply a change: a three-way strategic merge patch.
    let out = k.ok(&["apply", "-f", "-"], Some(&secret("xa: \"1\"", "Yg==")));
    assert_eq!(out.trim(), "secret/kube-s1 created");
    let out = k.ok(&["apply", "-f", "-"], Some(&secret("yb: \"2\"", "Yw==")));
    assert_eq!(out.trim(), "secret/kube-s1 configured");
    assert_eq!(
        get("{.metadata.labels}"),
        r#"{"yb":"2"}"#,
        "xa removed, yb added"
    );
    assert_eq!(get("{.data.a}"), "Yw==");
    let out = k.ok(&["apply", "-f", "-"], Some(&secret("yb: \"2\"", "Yw==")));
    assert_eq!(out.trim(), "secret/kube-s1 unchanged");

    // patch (strategic by default), with a directive; a malformed one changes nothing.
    let p = r#"{"metadata":{"labels":{"z":"3"},"finalizers":["example.com/keep"]}}"#;
    assert_eq!(
        k.ok(&["patch", "secret", "kube-s1", "-p", p], None).trim(),
        "secret/kube-s1 patched"
    );
    let p = r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["example.com/keep"],"labels":{"$patch":"replace","w":"4"}}}"#;
    assert_eq!(
        k.ok(&["patch", "secret", "kube-s1", "-p", p], None).trim(),
        "secret/kube-s1 patched"
    );
    assert_eq!(get("{.metadata.labels}"), r#"{"w":"4"}"#);
    assert_eq!(get("{.metadata.finalizers}"), "");
    let before = get("{.metadata.resourceVersion}");
    let (code, _, err) = k.run(
        &[
            "patch",
            "secret",
            "kube-s1",
            "-p",
            r#"{"metadata":{"$frobnicate":1}}"#,
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("unknown directive"), "{err}");
    assert_eq!(
        get("{.metadata.resourceVersion}"),
        before,
        "nothing changed"
    );

    // edit and label.
    let (code, out, err) = k.edit(&["secret", "kube-s1"], "s/^    w: \"4\"$/    w: \"5\"/");
    assert_eq!((code, out.trim()), (0, "secret/kube-s1 edited"), "{err}");
    assert_eq!(get("{.metadata.labels.w}"), "5");
    assert_eq!(
        k.ok(&["label", "secret", "kube-s1", "v=6"], None).trim(),
        "secret/kube-s1 labeled"
    );

    // A kind bootplane does not serve: kube's 404 for it, whatever the body.
    let (code, _, err) = k.run(
        &["create", "configmap", "kube-c", "--from-literal=a=b"],
        None,
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("the server could not find the requested resource"),
        "{err}"
    );
    k.ok(&["delete", "secret", "kube-s1", "kube-s2"], None);
    let (_, out, _) = k.run(&["get", "secrets"], None);
    assert!(!out.contains("kube-s"), "{out}");
}
