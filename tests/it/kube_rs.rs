//! kube-rs (the `kube` crate, v5, the client Rust controllers are written with) against
//! the real `bootplane serve` over TLS, from a kubeconfig holding the state dir's CA and
//! the admin token, unchanged (issue 34): `Discovery::run` finds bootplane's groups and
//! resources with their scopes and verbs; `Api::<DynamicObject>` applies (server-side,
//! with the 409 of a conflicting manager and `force`), lists with a label selector,
//! merge-patches and deletes; two `watcher()`s follow the changes, one starting with a
//! paged list then a watch (which bootplane ends every 2 s: it goes on from the bookmark,
//! not a re-list), one with the streaming list (`sendInitialEvents`). Then the same
//! watch parameters on the wire: bookmarks, the end-of-initial-events bookmark, and the
//! Status of the requests kube refuses.

use crate::support;

use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{verbs, Discovery, Scope};
use kube::runtime::watcher;
use serde_json::json;

use support::bootplane::Bootplane;

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

fn server(name: &str, uuid: &str) -> serde_json::Value {
    json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name, "labels": {"rack": "r1"}}, "spec": {"systemUUID": uuid}})
}

/// What a watcher reported, in order: `("apply"|"delete"|"init"|"done", name)`.
type Seen = tokio::sync::mpsc::UnboundedReceiver<(&'static str, String)>;

fn follow(api: Api<DynamicObject>, cfg: watcher::Config) -> Seen {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut w = watcher(api, cfg).boxed();
        while let Some(ev) = w.next().await {
            let seen = match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    ("apply", o.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Delete(o)) => ("delete", o.metadata.name.unwrap_or_default()),
                Ok(watcher::Event::Init) => ("init", String::new()),
                Ok(watcher::Event::InitDone) => ("done", String::new()),
                Err(e) => ("error", e.to_string()),
            };
            if tx.send(seen).is_err() {
                break;
            }
        }
    });
    rx
}

/// The events up to and including `want` (30 s at most).
async fn until(rx: &mut Seen, want: (&str, &str)) -> Vec<(&'static str, String)> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) => {
                let done = (e.0, e.1.as_str()) == want;
                seen.push(e);
                if done {
                    return seen;
                }
            }
            other => panic!("no {want:?} from the watcher ({other:?}): {seen:?}"),
        }
    }
}

#[test]
fn kube_rs_discovery_apply_list_and_watchers() {
    let b = Bootplane::start(&[]);
    let home = tempfile::tempdir().unwrap();
    let cfg = home.path().join("kubeconfig");
    support::kube::write_kubeconfig(&cfg, &b.api, &b.dir.join("tls/ca.crt"), &b.token);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = client(&cfg).await;
        // Discovery: every group, Servers cluster-scoped and ServerClaims namespaced,
        // with the verbs a controller needs.
        let d = Discovery::new(client.clone()).run().await.unwrap();
        let groups: Vec<&str> = d.groups().map(|g| g.name()).collect();
        for g in [
            "",
            "metal.ironcore.dev",
            "provisioning.bootplane.dev",
            "auth.bootplane.dev",
        ] {
            assert!(groups.contains(&g), "{g:?} not in {groups:?}");
        }
        let gvk = |k: &str| GroupVersionKind::gvk("metal.ironcore.dev", "v1alpha1", k);
        let (ar, caps) = d.resolve_gvk(&gvk("Server")).unwrap();
        assert_eq!(
            (ar.plural.as_str(), &caps.scope),
            ("servers", &Scope::Cluster)
        );
        for v in [
            verbs::LIST,
            verbs::WATCH,
            verbs::PATCH,
            verbs::CREATE,
            verbs::DELETE,
        ] {
            assert!(caps.supports_operation(v), "{v}");
        }
        let (_, caps) = d.resolve_gvk(&gvk("ServerClaim")).unwrap();
        assert_eq!(caps.scope, Scope::Namespaced);
        let secrets = d
            .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Secret"))
            .unwrap();
        assert_eq!(
            (secrets.0.plural.as_str(), &secrets.1.scope),
            ("secrets", &Scope::Namespaced)
        );

        let servers: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let mut listed = follow(servers.clone(), watcher::Config::default().timeout(2));
        let mut streamed = follow(
            servers.clone(),
            watcher::Config::default().streaming_lists(),
        );
        for rx in [&mut listed, &mut streamed] {
            let first = until(rx, ("done", "")).await;
            assert_eq!(first, [("init", String::new()), ("done", String::new())]);
        }

        // Server-side apply: created; another manager's UUID is a 409 naming the field,
        // and with force it takes the field over.
        let a = "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5";
        let applied = (servers.patch(
            "kube-rs-a",
            &PatchParams::apply("kube-rs"),
            &Patch::Apply(server("kube-rs-a", a)),
        ))
        .await
        .unwrap();
        assert_eq!(applied.data["spec"]["systemUUID"], a);
        let other = server("kube-rs-a", "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d6");
        let err = (servers.patch(
            "kube-rs-a",
            &PatchParams::apply("other"),
            &Patch::Apply(&other),
        ))
        .await
        .unwrap_err();
        match err {
            kube::Error::Api(s) => {
                assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"), "{s:?}");
                assert!(s.message.contains(".spec.systemUUID"), "{}", s.message);
            }
            e => panic!("not a Status: {e}"),
        }
        let forced = (servers.patch(
            "kube-rs-a",
            &PatchParams::apply("other").force(),
            &Patch::Apply(&other),
        ))
        .await
        .unwrap();
        assert_eq!(
            forced.data["spec"]["systemUUID"],
            "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d6"
        );

        // List with a label selector; a merge patch; the watchers saw the server.
        let l = servers
            .list(&ListParams::default().labels("rack=r1"))
            .await
            .unwrap();
        let names: Vec<_> = l
            .items
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["kube-rs-a"]);
        let p = json!({"metadata": {"labels": {"rack": "r2"}}});
        let patched = (servers.patch("kube-rs-a", &PatchParams::default(), &Patch::Merge(&p)))
            .await
            .unwrap();
        assert_eq!(patched.metadata.labels.unwrap()["rack"], "r2");
        assert!(servers
            .list(&ListParams::default().labels("rack=r1"))
            .await
            .unwrap()
            .items
            .is_empty());
        for rx in [&mut listed, &mut streamed] {
            until(rx, ("apply", "kube-rs-a")).await;
        }

        // Past the list-watch watcher's 2-s watches: it goes on from where the last one
        // ended (a bookmark), without listing again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        servers
            .delete("kube-rs-a", &DeleteParams::default())
            .await
            .unwrap();
        for rx in [&mut listed, &mut streamed] {
            let seen = until(rx, ("delete", "kube-rs-a")).await;
            assert!(
                seen.iter().all(|(k, _)| *k == "apply" || *k == "delete"),
                "{seen:?}"
            );
        }

        // A group bootplane does not serve: 404 NotFound, as kube's.
        let nope = ApiResource::from_gvk(&GroupVersionKind::gvk("nope.example", "v1", "Thing"));
        let err = Api::<DynamicObject>::all_with(client.clone(), &nope)
            .list(&ListParams::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 404),
            "{err}"
        );
    });
}

/// The body of `GET path` (a watch that ends by `timeoutSeconds`), as lines of JSON,
/// or the status code it was refused with.
fn get_lines(b: &Bootplane, path: &str) -> Result<Vec<serde_json::Value>, u16> {
    match b.req("GET", path).call() {
        Ok(r) => {
            let text = r.into_string().unwrap();
            let values = serde_json::Deserializer::from_str(&text).into_iter();
            Ok(values.map(Result::unwrap).collect())
        }
        Err(ureq::Error::Status(c, _)) => Err(c),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn watch_bookmarks_initial_events_and_list_versions_on_the_wire() {
    let b = Bootplane::start(&[]);
    let servers = "/apis/metal.ironcore.dev/v1alpha1/servers";
    let create = |name: &str, uuid: &str| {
        let body = server(name, uuid).to_string();
        (b.req("POST", servers))
            .set("Content-Type", "application/json")
            .send_string(&body)
            .unwrap();
    };
    create("wire-a", "1c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5");
    let list = get_lines(&b, servers).unwrap();
    let rv: u64 = list[0]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // A watch from rv whose selector skips the one change after it: at its end a
    // bookmark carries that change's version, so the client resumes past it.
    let watch = format!("{servers}?watch=true&labelSelector=rack%3Dnone&allowWatchBookmarks=true&timeoutSeconds=2&resourceVersion={rv}");
    let waiter = std::thread::scope(|s| {
        let h = s.spawn(|| get_lines(&b, &watch));
        std::thread::sleep(Duration::from_millis(500));
        create("wire-b", "1c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d6");
        h.join().unwrap().unwrap()
    });
    assert_eq!(waiter.len(), 1, "{waiter:?}");
    assert_eq!(waiter[0]["type"], "BOOKMARK");
    assert_eq!(waiter[0]["object"]["kind"], "Server");
    let marked: u64 = waiter[0]["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(marked > rv, "{waiter:?}");
    // Without allowWatchBookmarks: no bookmark, nothing at all.
    let plain = format!(
        "{servers}?watch=true&labelSelector=rack%3Dnone&timeoutSeconds=1&resourceVersion={rv}"
    );
    assert_eq!(
        get_lines(&b, &plain).unwrap(),
        Vec::<serde_json::Value>::new()
    );

    // The streaming list: the objects as ADDED, then the bookmark that ends them.
    let stream = format!("{servers}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1");
    let ev = get_lines(&b, &stream).unwrap();
    let kinds: Vec<(&str, &str)> = (ev.iter())
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("ADDED", "wire-a"), ("ADDED", "wire-b"), ("BOOKMARK", "")]
    );
    assert_eq!(
        ev[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // What kube refuses, with its codes; a list's versions.
    for (query, code) in [
        (
            "?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
            422,
        ),
        (
            "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            422,
        ),
        ("?watch=true&allowWatchBookmarks=maybe", 400),
        ("?resourceVersion=1&resourceVersionMatch=Exact", 410),
        ("?resourceVersion=999999999", 504),
        ("?resourceVersionMatch=NotOlderThan", 422),
        ("?resourceVersion=0&resourceVersionMatch=Sometime", 400),
    ] {
        assert_eq!(
            get_lines(&b, &format!("{servers}{query}")).err(),
            Some(code),
            "{query}"
        );
    }
    let now = get_lines(&b, servers).unwrap()[0]["metadata"]["resourceVersion"].clone();
    let exact = format!(
        "{servers}?resourceVersionMatch=Exact&resourceVersion={}",
        now.as_str().unwrap()
    );
    assert_eq!(
        get_lines(&b, &exact).unwrap()[0]["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}
