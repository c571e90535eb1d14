//! The ONTAP export backend against a small fake ONTAP REST server on 127.0.0.1 that
//! keeps policies, rules and volumes and records every request. This checks the
//! request sequence and bodies against the published API shape; it is not a test
//! against real ONTAP.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bootplane::nfs::ontap::{Ontap, OntapConfig};
use bootplane::nfs::{Access, ExportBackend, ExportRule, NfsError, Protocol};
use serde_json::{json, Value};

#[derive(Default)]
struct Fake {
    log: Vec<(String, String, Value)>,
    next_id: u64,
    /// policy id → (name, svm, rules by index)
    policies: BTreeMap<u64, (String, String, BTreeMap<u64, Value>)>,
    /// uuid → (svm, junction path, export policy name)
    volumes: BTreeMap<String, (String, String, String)>,
}

type Shared = Arc<Mutex<Fake>>;

fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            (
                k.to_string(),
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect()
}

async fn handle(State(st): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    let method = parts.method.to_string();
    let path = parts.uri.path().to_string();
    let q = query(&parts.uri);
    let mut f = st.lock().unwrap();
    f.log
        .push((method.clone(), parts.uri.to_string(), body.clone()));
    let expected = format!("Basic {}", base64_encode("admin:secret"));
    if parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"message": "not authorized for that command", "code": "6"}})),
        )
            .into_response();
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["api", "cluster"]) => {
            Json(json!({"name": "fake-cluster", "version": {"full": "NetApp Release 9.14.1"}}))
                .into_response()
        }
        ("GET", ["api", "protocols", "nfs", "export-policies"]) => {
            let recs: Vec<Value> = f
                .policies
                .iter()
                .filter(|(_, (n, s, _))| Some(n) == q.get("name") && Some(s) == q.get("svm.name"))
                .map(|(id, (n, _, _))| json!({"id": id, "name": n}))
                .collect();
            Json(json!({"records": recs, "num_records": recs.len()})).into_response()
        }
        ("POST", ["api", "protocols", "nfs", "export-policies"]) => {
            f.next_id += 1;
            let id = 8589934590 + f.next_id;
            let name = body["name"].as_str().unwrap().to_string();
            let svm = body["svm"]["name"].as_str().unwrap().to_string();
            f.policies.insert(id, (name, svm, BTreeMap::new()));
            (StatusCode::CREATED, Json(json!({}))).into_response()
        }
        ("GET", ["api", "protocols", "nfs", "export-policies", id, "rules"]) => {
            let Some(p) = f.policies.get(&id.parse::<u64>().unwrap()) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            let recs: Vec<Value> = p.2.values().cloned().collect();
            Json(json!({"records": recs, "num_records": recs.len()})).into_response()
        }
        ("POST", ["api", "protocols", "nfs", "export-policies", id, "rules"]) => {
            let Some(p) = f.policies.get_mut(&id.parse::<u64>().unwrap()) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            for k in ["clients", "ro_rule", "rw_rule"] {
                if body.get(k).is_none() {
                    return (
                        StatusCode::BAD_REQUEST,
                        Json(json!({"error": {"message": format!("missing {k}")}})),
                    )
                        .into_response();
                }
            }
            let idx = body["index"].as_u64().unwrap();
            let mut rec = body.clone();
            rec["_links"] = json!({"self": {"href": format!("/api/protocols/nfs/export-policies/{id}/rules/{idx}")}});
            p.2.insert(idx, rec);
            (StatusCode::CREATED, Json(json!({}))).into_response()
        }
        ("DELETE", ["api", "protocols", "nfs", "export-policies", id, "rules", idx]) => {
            let Some(p) = f.policies.get_mut(&id.parse::<u64>().unwrap()) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            match p.2.remove(&idx.parse::<u64>().unwrap()) {
                Some(_) => Json(json!({})).into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        ("GET", ["api", "storage", "volumes"]) => {
            let recs: Vec<Value> = f
                .volumes
                .iter()
                .filter(|(_, (svm, path, _))| Some(svm) == q.get("svm.name") && Some(path) == q.get("nas.path"))
                .map(|(uuid, (_, path, pol))| json!({"uuid": uuid, "name": "vol1", "nas": {"path": path, "export_policy": {"name": pol}}}))
                .collect();
            Json(json!({"records": recs, "num_records": recs.len()})).into_response()
        }
        ("PATCH", ["api", "storage", "volumes", uuid]) => {
            let Some(v) = f.volumes.get_mut(*uuid) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            v.2 = body["nas"]["export_policy"]["name"]
                .as_str()
                .unwrap()
                .to_string();
            (StatusCode::ACCEPTED, Json(json!({"job": {"uuid": "j1"}}))).into_response()
        }
        _ => Response::builder()
            .status(404)
            .body(Body::from("{}"))
            .unwrap(),
    }
}

fn base64_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn fake() -> (Shared, String, tokio::task::JoinHandle<()>) {
    let st: Shared = Arc::new(Mutex::new(Fake::default()));
    st.lock().unwrap().volumes.insert(
        "0a1b-vol".into(),
        ("svm1".into(), "/images/ubuntu".into(), "default".into()),
    );
    let app = axum::Router::new().fallback(handle).with_state(st.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let h = tokio::spawn(async move {
        axum::serve(l, app).await.unwrap();
    });
    (st, url, h)
}

fn backend(url: &str, password: &str) -> Ontap {
    Ontap::new(OntapConfig {
        url: url.into(),
        svm: "svm1".into(),
        password: Some(password.into()),
        timeout_ms: 5_000,
        ..Default::default()
    })
    .unwrap()
}

fn take_log(st: &Shared) -> Vec<(String, String, Value)> {
    std::mem::take(&mut st.lock().unwrap().log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_lifecycle_against_fake_ontap() {
    let (st, url, server) = fake().await;
    let o = backend(&url, "secret");
    let h = o.health().await.unwrap();
    assert!(h.detail.contains("9.14.1"), "{h:?}");
    take_log(&st);

    // ensure_export: creates the policy and assigns it to the volume with that junction path.
    o.ensure_export("/images/ubuntu", std::path::Path::new("/ignored"))
        .await
        .unwrap();
    let log = take_log(&st);
    let calls: Vec<String> = log
        .iter()
        .map(|(m, u, _)| format!("{m} {}", u.split('?').next().unwrap()))
        .collect();
    assert_eq!(
        calls,
        [
            "GET /api/protocols/nfs/export-policies",
            "POST /api/protocols/nfs/export-policies",
            "GET /api/protocols/nfs/export-policies",
            "GET /api/storage/volumes",
            "PATCH /api/storage/volumes/0a1b-vol"
        ]
    );
    assert_eq!(
        log[1].2,
        json!({"name": "bootplane_images_ubuntu", "svm": {"name": "svm1"}})
    );
    assert!(
        log[3].1.contains("nas.path=%2Fimages%2Fubuntu"),
        "{}",
        log[3].1
    );
    assert_eq!(
        log[4].2,
        json!({"nas": {"export_policy": {"name": "bootplane_images_ubuntu"}}})
    );
    assert_eq!(
        st.lock().unwrap().volumes["0a1b-vol"].2,
        "bootplane_images_ubuntu"
    );
    // Idempotent: nothing is created or patched the second time.
    o.ensure_export("/images/ubuntu", std::path::Path::new("/ignored"))
        .await
        .unwrap();
    assert!(take_log(&st).iter().all(|(m, _, _)| m == "GET"));

    // Two rules.
    let r1 = ExportRule::read_only(1, "10.0.0.5".parse().unwrap());
    let r2 = ExportRule {
        index: 2,
        client: "10.0.1.0/24".parse().unwrap(),
        access: Access::Rw,
        protocols: vec![Protocol::Nfs3],
        superuser: true,
    };
    o.set_rules("/images/ubuntu", vec![r2.clone(), r1.clone()])
        .await
        .unwrap();
    let posts: Vec<Value> = take_log(&st)
        .into_iter()
        .filter(|(m, _, _)| m == "POST")
        .map(|(_, _, b)| b)
        .collect();
    assert_eq!(
        posts,
        [
            json!({"index":1,"clients":[{"match":"10.0.0.5"}],"ro_rule":["sys"],"rw_rule":["never"],"superuser":["none"],"protocols":["any"]}),
            json!({"index":2,"clients":[{"match":"10.0.1.0/24"}],"ro_rule":["sys"],"rw_rule":["sys"],"superuser":["sys"],"protocols":["nfs3"]}),
        ]
    );

    // Change: keep r1, drop r2, add r3. The stale rule is deleted before the new one is created.
    let r3 = ExportRule::read_only(3, "10.0.2.7".parse().unwrap());
    o.set_rules("/images/ubuntu", vec![r1.clone(), r3])
        .await
        .unwrap();
    let changes: Vec<String> = take_log(&st)
        .into_iter()
        .filter(|(m, _, _)| m != "GET")
        .map(|(m, u, _)| format!("{m} {u}"))
        .collect();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(
        changes[0].starts_with("DELETE ") && changes[0].ends_with("/rules/2"),
        "{changes:?}"
    );
    assert!(
        changes[1].starts_with("POST ") && changes[1].ends_with("/rules"),
        "{changes:?}"
    );
    // Unchanged rules: no writes.
    o.set_rules(
        "/images/ubuntu",
        vec![r1, ExportRule::read_only(3, "10.0.2.7".parse().unwrap())],
    )
    .await
    .unwrap();
    assert!(take_log(&st).iter().all(|(m, _, _)| m == "GET"));

    // remove_export: every rule deleted; the empty (deny-all) policy stays on the volume.
    o.remove_export("/images/ubuntu").await.unwrap();
    let deletes = take_log(&st)
        .into_iter()
        .filter(|(m, _, _)| m == "DELETE")
        .count();
    assert_eq!(deletes, 2);
    {
        let f = st.lock().unwrap();
        assert!(f.policies.values().all(|p| p.2.is_empty()));
        assert_eq!(f.volumes["0a1b-vol"].2, "bootplane_images_ubuntu");
    }

    // Errors callers can branch on.
    assert!(matches!(
        o.set_rules("/images/other", vec![]).await,
        Err(NfsError::UnknownExport(_))
    ));
    assert!(matches!(
        o.ensure_export("/images/novolume", std::path::Path::new("/x"))
            .await,
        Err(NfsError::InvalidExport(..))
    ));
    let err = backend(&url, "wrong").health().await.unwrap_err();
    assert!(
        err.to_string().contains("http 401: not authorized"),
        "{err}"
    );
    server.abort();
}

#[tokio::test]
async fn unreachable_cluster_is_reported_as_down() {
    // Bind then drop to get a closed port on loopback.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = backend(&format!("http://127.0.0.1:{port}"), "secret");
    let err = o.health().await.unwrap_err();
    assert!(matches!(err, NfsError::Down(_)), "{err}");
}
