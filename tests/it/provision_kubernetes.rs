//! The rendered Kubernetes Job validates against the batch/v1 Job schema
//! (tests/fixtures/k8s-batch-v1-job.schema.json, an OpenAPI v3 subset; see its
//! `x-source`), strictly: unknown fields, wrong types, int32 overflow, missing required
//! fields, enum violations and malformed quantities are all errors. The validator is
//! checked to reject broken Jobs too. The runner's API calls are tested against a fake
//! API server on 127.0.0.1; nothing here talks to a real cluster.

use std::sync::{Arc, Mutex};

use bootplane::provision::kubernetes::{render_job, KubernetesConfig, KubernetesRunner};
use bootplane::provision::{JobRunner, JobState, NfsSource, ProvisionRequest};
use serde_json::{json, Value};

fn schema() -> Value {
    serde_json::from_str(include_str!("../fixtures/k8s-batch-v1-job.schema.json")).unwrap()
}

fn resolve<'a>(root: &'a Value, r: &str) -> &'a Value {
    let name = r
        .strip_prefix("#/components/schemas/")
        .unwrap_or_else(|| panic!("unsupported $ref {r}"));
    root["components"]["schemas"]
        .get(name)
        .unwrap_or_else(|| panic!("schema {name} missing from the fixture"))
}

/// Kubernetes quantity syntax: number with optional binary/decimal SI suffix or exponent.
fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    let digits_ok = !num.is_empty() && num != "." && num.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || ((suffix.starts_with('e') || suffix.starts_with('E'))
        && suffix[1..]
            .strip_prefix(['+', '-'])
            .unwrap_or(&suffix[1..])
            .chars()
            .all(|c| c.is_ascii_digit())
        && suffix.len() > 1);
    digits_ok && suffix_ok
}

fn validate(root: &Value, schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return validate(root, resolve(root, r), v, path, errs);
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(root, s, v, path, errs);
        }
    }
    if let Some(one) = schema.get("oneOf").and_then(Value::as_array) {
        let ok = one.iter().filter(|s| {
            let mut e = Vec::new();
            validate(root, s, v, path, &mut e);
            e.is_empty()
        });
        if ok.count() != 1 {
            errs.push(format!("{path}: matches none (or several) of oneOf"));
        }
    }
    if schema.get("x-bootplane-quantity").is_some()
        && !(v.is_number() || v.as_str().is_some_and(is_quantity))
    {
        errs.push(format!("{path}: {v} is not a quantity"));
    }
    if let Some(en) = schema.get("enum").and_then(Value::as_array) {
        if !en.contains(v) {
            errs.push(format!("{path}: {v} not one of {en:?}"));
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(o) = v.as_object() else {
                return errs.push(format!("{path}: expected object, got {v}"));
            };
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !o.contains_key(req.as_str().unwrap()) {
                    errs.push(format!("{path}: missing required field {req}"));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties");
            for (k, val) in o {
                let p = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), extra) {
                    (Some(s), _) => validate(root, s, val, &p, errs),
                    (None, Some(s)) => validate(root, s, val, &p, errs),
                    (None, None) if props.is_some() => errs.push(format!("{p}: unknown field")),
                    (None, None) => {}
                }
            }
        }
        Some("array") => {
            let Some(a) = v.as_array() else {
                return errs.push(format!("{path}: expected array, got {v}"));
            };
            if let Some(items) = schema.get("items") {
                for (i, x) in a.iter().enumerate() {
                    validate(root, items, x, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Some("string") if !v.is_string() => errs.push(format!("{path}: expected string, got {v}")),
        Some("boolean") if !v.is_boolean() => {
            errs.push(format!("{path}: expected boolean, got {v}"))
        }
        Some("number") if !v.is_number() => errs.push(format!("{path}: expected number, got {v}")),
        Some("integer") => match v.as_i64() {
            None => errs.push(format!("{path}: expected integer, got {v}")),
            Some(n)
                if schema.get("format").and_then(Value::as_str) == Some("int32")
                    && i32::try_from(n).is_err() =>
            {
                errs.push(format!("{path}: {n} overflows int32"))
            }
            _ => {}
        },
        _ => {}
    }
}

fn job_errors(job: &Value) -> Vec<String> {
    let root = schema();
    let mut errs = Vec::new();
    validate(
        &root,
        resolve(&root, "#/components/schemas/io.k8s.api.batch.v1.Job"),
        job,
        "job",
        &mut errs,
    );
    errs
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn req() -> ProvisionRequest {
    ProvisionRequest {
        id: Some("0f6c2a8e-action".into()),
        server: "bms-zone1-rack4-slot09".into(),
        image: Some("ubuntu-24.04-s390x".into()),
        nfs: Some(NfsSource {
            server: "10.10.0.2".into(),
            export: "/srv/images/ubuntu-24.04".into(),
            path: "disk.img.zst".into(),
        }),
        source: None,
        sha256: Some("c".repeat(64)),
        manifest: None,
        target: "/dev/disk/by-path/ccw-0.0.0100".into(),
        resolved_target: None,
    }
}

#[test]
fn rendered_job_validates_against_the_job_schema() {
    for cfg in [
        KubernetesConfig::default(),
        KubernetesConfig {
            service_account: Some("bootplane-provisioner".into()),
            cpu_limit: "1500m".into(),
            memory_limit: "2G".into(),
            ..Default::default()
        },
    ] {
        let job = render_job(&cfg, &req(), "0f6c2a8e-action");
        assert_eq!(job_errors(&job), Vec::<String>::new(), "{job:#}");
        // What the schema cannot say but the API server enforces for Jobs.
        assert_eq!(job["apiVersion"], "batch/v1");
        assert_eq!(job["kind"], "Job");
        assert!(is_dns1123_label(job["metadata"]["name"].as_str().unwrap()));
        let pod = &job["spec"]["template"]["spec"];
        assert!(["Never", "OnFailure"].contains(&pod["restartPolicy"].as_str().unwrap()));
        assert_eq!(pod["nodeSelector"], json!({"genctl.role.service": "true"}));
        assert_eq!(pod["volumes"][0]["nfs"]["server"], "10.10.0.2");
        assert_eq!(pod["volumes"][0]["nfs"]["path"], "/srv/images/ubuntu-24.04");
        let c = &pod["containers"][0];
        assert!(
            c["resources"]["limits"]["cpu"].is_string()
                && c["resources"]["requests"]["memory"].is_string()
        );
        let mounts: Vec<&str> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        let vols: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            mounts, vols,
            "every volume is mounted and every mount has a volume"
        );
        assert!(job["spec"]["ttlSecondsAfterFinished"].as_i64().unwrap() >= 0);
        for (k, v) in job["metadata"]["labels"].as_object().unwrap() {
            let v = v.as_str().unwrap();
            assert!(
                v.len() <= 63
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "label {k}={v}"
            );
        }
    }
}

#[test]
fn validator_rejects_broken_jobs() {
    let good = render_job(&KubernetesConfig::default(), &req(), "x");
    let mut bad = good.clone();
    bad["spec"]["ttlSecondsAfterFinish"] = json!(10);
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("ttlSecondsAfterFinish: unknown field")));
    let mut bad = good.clone();
    bad["spec"]["backoffLimit"] = json!("2");
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("backoffLimit: expected integer")));
    let mut bad = good.clone();
    bad["spec"]["backoffLimit"] = json!(1u64 << 33);
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("overflows int32")));
    let mut bad = good.clone();
    bad["spec"]["template"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("containers");
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("missing required field \"containers\"")));
    let mut bad = good.clone();
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
        json!("2 cores");
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("not a quantity")));
    let mut bad = good.clone();
    bad["spec"]["template"]["spec"]["volumes"][0]["nfs"]
        .as_object_mut()
        .unwrap()
        .remove("server");
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("missing required field \"server\"")));
    let mut bad = good.clone();
    bad["spec"]["template"]["spec"]["restartPolicy"] = json!("Sometimes");
    assert!(job_errors(&bad).iter().any(|e| e.contains("not one of")));
    let mut bad = good;
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!("yes");
    assert!(job_errors(&bad)
        .iter()
        .any(|e| e.contains("readOnly: expected boolean")));
    for q in [
        "1",
        "500m",
        "1.5",
        "2Gi",
        "128974848",
        "129e6",
        "123Mi",
        ".5",
    ] {
        assert!(is_quantity(q), "{q}");
    }
    for q in ["", "2 cores", "1.2.3", "Gi", "5Q", "1e"] {
        assert!(!is_quantity(q), "{q}");
    }
}

/// The runner against a fake API server: create (201, then 409 for the same id),
/// status mapping, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_creates_reads_and_deletes_jobs_on_a_fake_api_server() {
    use axum::extract::{Request, State};
    use axum::response::IntoResponse;
    type Log = Arc<Mutex<(Vec<(String, String, Value)>, Option<Value>)>>;
    let st: Log = Arc::new(Mutex::new((Vec::new(), None)));
    async fn handle(State(st): State<Log>, req: Request) -> axum::response::Response {
        let (parts, body) = req.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut s = st.lock().unwrap();
        s.0.push((
            parts.method.to_string(),
            parts.uri.path().to_string(),
            body.clone(),
        ));
        match parts.method.as_str() {
            "POST" if s.1.is_some() => (
                axum::http::StatusCode::CONFLICT,
                axum::Json(json!({"kind":"Status","message":"jobs.batch already exists"})),
            )
                .into_response(),
            "POST" => {
                let mut job = body;
                job["status"] = json!({"active": 1});
                s.1 = Some(job.clone());
                (axum::http::StatusCode::CREATED, axum::Json(job)).into_response()
            }
            "GET" => match &s.1 {
                Some(j) => axum::Json(j.clone()).into_response(),
                None => (
                    axum::http::StatusCode::NOT_FOUND,
                    axum::Json(json!({"message":"not found"})),
                )
                    .into_response(),
            },
            "DELETE" => {
                s.1 = None;
                axum::Json(json!({"kind":"Status","status":"Success"})).into_response()
            }
            _ => axum::http::StatusCode::METHOD_NOT_ALLOWED.into_response(),
        }
    }
    let app = axum::Router::new().fallback(handle).with_state(st.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(l, app).await });

    let r = KubernetesRunner::new(KubernetesConfig {
        api_url: url,
        ..Default::default()
    })
    .unwrap();
    let id = r.start(req()).await.unwrap();
    assert_eq!(id, "0f6c2a8e-action");
    {
        let s = st.lock().unwrap();
        assert_eq!(s.0[0].0, "POST");
        assert_eq!(s.0[0].1, "/apis/batch/v1/namespaces/bootplane/jobs");
        assert_eq!(job_errors(&s.0[0].2), Vec::<String>::new());
    }
    assert_eq!(
        r.start(req()).await.unwrap(),
        id,
        "409 for the same job is an idempotent start"
    );
    // A Job under that name running another request is not taken for this one.
    let mut other = req();
    other.target = "/dev/disk/by-path/ccw-0.0.0200".into();
    assert!(matches!(
        r.start(other).await,
        Err(bootplane::provision::JobError::Forbidden(_))
    ));
    let s = r.status(&id).await.unwrap();
    assert_eq!(s.state, JobState::Running);
    assert!(s
        .job_ref
        .unwrap()
        .starts_with("bootplane/provision-bms-zone1-rack4-slot09-"));
    st.lock().unwrap().1.as_mut().unwrap()["status"] = json!({"failed": 3, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]});
    let s = r.status(&id).await.unwrap();
    assert_eq!(
        (s.state, s.reason.as_deref()),
        (
            JobState::Failed,
            Some("BackoffLimitExceeded: Job has reached the specified backoff limit")
        )
    );
    r.cancel(&id).await.unwrap();
    assert_eq!(st.lock().unwrap().0.last().unwrap().0, "DELETE");
    assert!(
        r.status(&id).await.is_err(),
        "deleted Job is reported as gone"
    );
    assert!(r.status("unknown").await.is_err());
    server.abort();
}
