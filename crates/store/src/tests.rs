//! The object store's tests: metadata, compare-and-swap, finalizers and cascading
//! deletion, validation, stored texts and limits.

use super::*;
use serde_json::json;

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path()).unwrap();
    (d, s)
}

fn rt(name: &str) -> Arc<ResourceType> {
    Registry::global().resolve(name).unwrap()
}

#[tokio::test]
async fn create_sets_metadata_and_update_is_cas() {
    let (_d, s) = store();
    let srv = rt("server");
    let o = s
        .create(
            &srv,
            json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000001"}}),
        )
        .await
        .unwrap();
    assert_eq!(o["apiVersion"], "metal.ironcore.dev/v1alpha1");
    assert_eq!(o["metadata"]["generation"], 1);
    assert_eq!(o["spec"]["reclaimPolicy"], "Recycle", "default applied");
    assert!(o["metadata"]["uid"].as_str().unwrap().len() > 10);
    let mut stale = (*o).clone();
    let mut upd = (*o).clone();
    upd["spec"]["power"] = json!("On");
    let o2 = s.update(&srv, upd, Part::Main).await.unwrap();
    assert_eq!(o2["metadata"]["generation"], 2);
    stale["spec"]["power"] = json!("Off");
    let err = s.update(&srv, stale, Part::Main).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    // Status through the main endpoint is ignored; through Status it lands.
    let mut st = (*o2).clone();
    st["status"] = json!({"state": "Available"});
    let o3 = s.update(&srv, st.clone(), Part::Main).await.unwrap();
    assert!(o3.get("status").is_none());
    let o4 = s.update(&srv, st, Part::Status).await.unwrap();
    assert_eq!(o4["status"]["state"], "Available");
    assert_eq!(
        o4["metadata"]["generation"], 2,
        "status does not bump generation"
    );
}

#[tokio::test]
async fn finalizers_and_cascade() {
    let (_d, s) = store();
    let claim = rt("serverclaim");
    let sbc = rt("sbc");
    let c = s
        .create(&claim, json!({"metadata": {"name": "c", "finalizers": ["x/f"]}, "spec": {"image": "i", "power": "On"}}))
        .await
        .unwrap();
    let owner = json!([{"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim", "name": "c", "uid": c["metadata"]["uid"]}]);
    s.create(&sbc, json!({"metadata": {"name": "c", "ownerReferences": owner}, "spec": {"serverRef": {"name": "s"}}}))
        .await
        .unwrap();
    let marked = s.delete(&claim, None, "c", None).await.unwrap();
    assert!(meta::is_deleting(&marked));
    assert!(
        s.get(&sbc, None, "c").is_ok(),
        "dependent stays while owner is only marked"
    );
    let mut f = (*s.get(&claim, None, "c").unwrap()).clone();
    f["metadata"]["finalizers"] = json!([]);
    s.update(&claim, f, Part::Main).await.unwrap();
    assert!(matches!(
        s.get(&claim, None, "c"),
        Err(StoreError::NotFound { .. })
    ));
    assert!(
        matches!(s.get(&sbc, None, "c"), Err(StoreError::NotFound { .. })),
        "cascaded"
    );
}

#[tokio::test]
async fn validation_names_problems_and_stores_nothing() {
    let (_d, s) = store();
    let claim = rt("serverclaim");
    let err = s
        .create(
            &claim,
            json!({"metadata": {"name": "c"}, "spec": {"power": "Sideways", "bogus": 1}}),
        )
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("spec.image: Required value"), "{msg}");
    assert!(msg.contains("spec.power"), "{msg}");
    assert!(msg.contains("unknown field \"spec.bogus\""), "{msg}");
    assert_eq!(s.revision(), 0);
    let c = s
        .create(&claim, json!({"metadata": {"name": "c"}, "spec": {"image": "i", "power": "On", "serverRef": {"name": "a"}}}))
        .await
        .unwrap();
    let mut u = (*c).clone();
    u["spec"]["serverRef"]["name"] = json!("b");
    let err = s.update(&claim, u, Part::Main).await.unwrap_err();
    assert!(err.to_string().contains("serverRef is immutable"), "{err}");
    let secret = rt("secret");
    let err = s
        .create(
            &secret,
            json!({"metadata": {"name": "x"}, "data": {"k": "not base64!"}}),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("data.k: illegal base64"), "{err}");
}

#[tokio::test]
async fn update_status_matches_update_of_the_status_part() {
    let (_d, s) = store();
    let srv = rt("server");
    let body = json!({"metadata": {"name": "a", "labels": {"z": "1", "a": "2"}},
        "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000001"}, "status": {"state": "Available", "powerState": "Off"}});
    let a = s.create(&srv, body.clone()).await.unwrap();
    let mut b_body = body.clone();
    b_body["metadata"]["name"] = json!("b");
    b_body["spec"]["systemUUID"] = json!("4c4c4544-0000-0000-0000-00000000000b");
    let b = s.create(&srv, b_body).await.unwrap();
    let status = json!({"state": "Reserved", "powerState": "Off", "conditions": []});
    let mut o = (*a).clone();
    o["status"] = status.clone();
    let via_update = s.update(&srv, o, Part::Status).await.unwrap();
    let via_status = s.update_status(&srv, &b, status.clone()).await.unwrap();
    // Same object but for the server-owned identity fields, same field order.
    let strip = |v: &Value| {
        let mut v = v.clone();
        for f in ["name", "uid", "resourceVersion", "creationTimestamp"] {
            v["metadata"].as_object_mut().unwrap().remove(f);
        }
        v["spec"].as_object_mut().unwrap().remove("systemUUID");
        v.to_string()
    };
    assert_eq!(strip(&via_update), strip(&via_status));
    assert_eq!(via_status["status"], status);
    assert_eq!(
        via_status["metadata"]["generation"], 1,
        "status is not spec"
    );
    // Unchanged: nothing written. Stale: conflict, nothing written.
    let rev = s.revision();
    let same = s
        .update_status(&srv, &via_status, status.clone())
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&same, &via_status));
    assert_eq!(s.revision(), rev);
    let err = s
        .update_status(&srv, &b, json!({"state": "Error"}))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert_eq!(s.get(&srv, None, "b").unwrap(), via_status);
    // An object without status gets one (appended, as update does).
    let mut c_body = body.clone();
    c_body["metadata"]["name"] = json!("c");
    c_body["spec"]["systemUUID"] = json!("4c4c4544-0000-0000-0000-00000000000c");
    c_body.as_object_mut().unwrap().remove("status");
    let c = s.create(&srv, c_body).await.unwrap();
    let c2 = s
        .update_status(&srv, &c, json!({"state": "Available"}))
        .await
        .unwrap();
    let keys: Vec<&String> = c2.as_object().unwrap().keys().collect();
    assert_eq!(keys.last().unwrap().as_str(), "status");
    // Still validated.
    let err = s
        .update_status(&srv, &c2, json!({"state": 5}))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
}

#[tokio::test]
async fn texts_are_the_bytes_of_the_parsed_objects() {
    let (_d, s) = store();
    let claim = rt("serverclaim");
    for (i, n) in ["b", "a", "c"].iter().enumerate() {
        let o = json!({"metadata": {"name": n, "labels": {"i": i.to_string(), "z": "v"},
            "annotations": {"x": "é\"\n"}},
            "spec": {"power": "On", "serverSelector": {"matchLabels": {"k": "v"}}, "image": "i:1"}});
        s.create(&claim, o).await.unwrap();
    }
    let t = s.get_text(&claim, Some("default"), "a").unwrap();
    let v = s.get(&claim, Some("default"), "a").unwrap();
    assert_eq!(&*t, serde_json::to_string(&*v).unwrap());
    assert!(
        t.starts_with(r#"{"metadata":{"name":"a","labels":{"i":"1","#),
        "{t}"
    );
    let (texts, rev) = s.list_text(&claim, Some("default"), None);
    let (objs, rev2) = s.list(&claim, Some("default"), None);
    assert_eq!(rev, rev2);
    let texts: Vec<&str> = texts.iter().map(|t| &**t).collect();
    let objs: Vec<String> = objs.map(|o| o.to_string()).collect();
    assert_eq!(texts, objs);
    let sel = Selector::parse("i=2").unwrap();
    let (texts, _) = s.list_text(&claim, None, Some(&sel));
    assert_eq!(texts.len(), 1);
    assert!(texts[0].contains(r#""name":"c""#));
    // Watch events carry the same text; a deletion's text is not offered (its
    // object carries the deleting revision).
    let mut w = s.watch(&claim, None, 0).unwrap();
    for _ in 0..3 {
        let e = w.next().await.unwrap();
        assert_eq!(&**e.text.as_ref().unwrap(), e.object.to_string());
    }
    s.delete(&claim, Some("default"), "a", None).await.unwrap();
    let e = w.next().await.unwrap();
    assert_eq!((e.kind, e.text.is_none()), ("DELETED", true));
    assert_eq!(e.object["metadata"]["resourceVersion"], e.rev.to_string());
    assert!(matches!(
        s.get_text(&claim, Some("default"), "a"),
        Err(StoreError::NotFound { .. })
    ));
}

#[tokio::test]
async fn object_limits_hold_on_every_write_path_and_store_nothing() {
    let (_d, s) = store();
    let srv = rt("server");
    let bad = json!({"metadata": {"name": "a", "labels": {"../../x y": "v"}}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000002"}});
    let err = s.create(&srv, bad).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid { causes, .. } if causes[0].field == "metadata.labels"),
        "{err}"
    );
    let o = s
        .create(
            &srv,
            json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000002"}}),
        )
        .await
        .unwrap();
    let rev = s.revision();
    // Update, patch: bad label value, too many annotation bytes.
    let mut u = (*o).clone();
    u["metadata"]["labels"] = json!({"k": "a\nb"});
    let err = s.update(&srv, u, Part::Main).await.unwrap_err();
    assert!(err.to_string().contains("metadata.labels.k"), "{err}");
    let big = json!({"metadata": {"annotations": {"n": "x".repeat(300 << 10)}}});
    let err = s
        .patch(&srv, None, "a", &big, Part::Main)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("262144"), "{err}");
    // An object over 1.5 MiB in total, created or updated (the limit is checked
    // where every write's text is made, status writes included).
    let secret = rt("secret");
    let big =
        |n: &str| json!({"metadata": {"name": n}, "stringData": {"k": "x".repeat(1200 << 10)}});
    let err = s.create(&secret, big("big")).await.unwrap_err();
    assert!(
        matches!(err, StoreError::TooLarge { size, limit: kv::MAX_VALUE_BYTES, .. } if size > 1600 << 10),
        "{err}"
    );
    assert!(err.to_string().contains("secrets \"big\""), "{err}");
    assert_eq!(s.revision(), rev, "nothing was stored");
    let small = s
        .create(&secret, json!({"metadata": {"name": "small"}}))
        .await
        .unwrap();
    let rev = s.revision();
    let err = s
        .update_from(&secret, small, big("small"), Part::Main)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert_eq!(s.revision(), rev, "nothing was stored");
    // A watch may start at the current revision, not after it.
    assert!(s.watch(&srv, None, rev).is_ok());
    match s.watch(&srv, None, rev + 1) {
        Err(e @ StoreError::TooLargeResourceVersion { .. }) => {
            assert_eq!(
                e.to_string(),
                format!("Too large resource version: {}, current: {rev}", rev + 1)
            )
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a watch from the future"),
    }
}

#[test]
fn merge_patch_rfc7386() {
    let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
    merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
    assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
}

/// Status writes, from a controller (`update_status`) or the `/status` subresource
/// (`update`/`patch` with `Part::Status`), are checked against bootplane's constraints
/// (`model::constraints`) and store nothing when refused; a value stored before a rule
/// existed does not block writes that leave it alone.
#[tokio::test]
async fn status_writes_are_checked_and_old_values_stand() {
    let (_d, s) = store();
    let srv = rt("server");
    let o = s
        .create(&srv, json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000003"},
            "status": {"state": "Available", "powerState": "Off"}}))
        .await
        .unwrap();
    let rev = s.revision();
    let field_of = |e: &StoreError| -> Vec<String> {
        match e {
            StoreError::Invalid { causes, .. } => causes.iter().map(|c| c.field.clone()).collect(),
            other => panic!("not Invalid: {other}"),
        }
    };
    let err = s
        .update_status(&srv, &o, json!({"state": "Availble", "powerState": "Off"}))
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.state"]);
    assert!(
        err.to_string().contains("Unsupported value: \"Availble\""),
        "{err}"
    );
    let nics = json!([{"name": "eth0", "macAddress": "52:54:00:00:00:01"}, {"name": "eth1", "macAddress": "52:54:00:00:00"}]);
    let err = s
        .update_status(
            &srv,
            &o,
            json!({"state": "Available", "networkInterfaces": nics}),
        )
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.networkInterfaces[1].macAddress"]);
    let err = s
        .patch(
            &srv,
            None,
            "a",
            &json!({"status": {"powerState": "Of"}}),
            Part::Status,
        )
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.powerState"]);
    let mut u = (*o).clone();
    u["status"]["state"] = json!("available");
    let err = s.update(&srv, u, Part::Status).await.unwrap_err();
    assert_eq!(field_of(&err), ["status.state"]);
    let err = s
        .patch(
            &srv,
            None,
            "a",
            &json!({"spec": {"systemUUID": "not-a-uuid"}}),
            Part::Main,
        )
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["spec.systemUUID"]);
    assert_eq!(s.revision(), rev, "nothing was stored");
    // The other kinds' status enums.
    let claim = rt("serverclaim");
    let c = s
        .create(
            &claim,
            json!({"metadata": {"name": "c"}, "spec": {"image": "i", "power": "On"}}),
        )
        .await
        .unwrap();
    let err = s
        .update_status(&claim, &c, json!({"phase": "Bund"}))
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.phase"]);
    let bmc = rt("bmc");
    let b = s
        .create(
            &bmc,
            json!({"metadata": {"name": "b"}, "spec": {"access": {"ip": "10.0.0.9"},
            "bmcSecretRef": {"name": "x"}, "protocol": {"name": "Redfish", "port": 443}}}),
        )
        .await
        .unwrap();
    let err = s
        .update_status(
            &bmc,
            &b,
            json!({"state": "Enabled", "powerState": "Standby"}),
        )
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.powerState"]);
    // A Server stored before the rules (written to the KV directly, as an older
    // bootplane could have): writes that leave its values alone go through.
    let old = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "old", "uid": "u-old", "generation": 1},
        "spec": {"systemUUID": "u1", "reclaimPolicy": "Recycle"},
        "status": {"state": "Parked", "networkInterfaces": [{"name": "eth0", "macAddress": "bogus"}]}});
    s.kv()
        .txn(vec![kv::Op::put(
            srv.key(None, "old"),
            kv::Compare::Absent,
            old,
        )])
        .await
        .unwrap();
    let cur = s.get(&srv, None, "old").unwrap();
    let mut st = cur["status"].clone();
    st["conditions"] = json!([]);
    let cur = s.update_status(&srv, &cur, st).await.unwrap();
    assert_eq!(cur["status"]["conditions"], json!([]));
    let cur = s
        .patch(
            &srv,
            None,
            "old",
            &json!({"metadata": {"labels": {"rack": "r1"}}}),
            Part::Main,
        )
        .await
        .unwrap();
    assert_eq!(cur["status"]["state"], "Parked");
    let err = s
        .update_status(&srv, &cur, json!({"state": "Parkd"}))
        .await
        .unwrap_err();
    assert_eq!(field_of(&err), ["status.state"]);
    s.update_status(&srv, &cur, json!({"state": "Available"}))
        .await
        .unwrap();
}

#[tokio::test]
async fn secrets_are_sealed_in_the_redb_file_and_resealed_under_a_new_first_key() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path()).unwrap();
    let secret = rt("secret");
    let o = s
        .create(
            &secret,
            json!({"metadata": {"name": "s", "namespace": "default"}, "stringData": {"p": "pl41nmarker"}}),
        )
        .await
        .unwrap();
    s.create(&rt("server"), json!({"metadata": {"name": "a"}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000001"}}))
        .await
        .unwrap();
    let counts = |s: &Store| s.kv().sealing().ledger.counts();
    assert_eq!(counts(&s), [("key1".to_string(), 1)].into());
    // The text handed back and kept in memory is plain; the file holds only ciphertext.
    assert_eq!(
        s.get_text(&secret, Some("default"), "s").unwrap().as_ref(),
        o.to_string()
    );
    close(s).await;
    let s = Store::open(d.path()).unwrap();
    let file = std::fs::read(d.path().join("store.redb")).unwrap();
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "pl41nmarker");
    assert!(!file.windows(b64.len()).any(|w| w == b64.as_bytes()));
    assert!(file
        .windows(40)
        .any(|w| w.starts_with(b"bootplane:enc:xchacha20poly1305:v1:key1:")));
    assert_eq!(
        *s.get(&secret, Some("default"), "s").unwrap(),
        *o,
        "same object, same resourceVersion"
    );
    // A new key first: one reseal pass rewrites the Secret (and nothing else).
    let key_file = d.path().join("secrets.key");
    let old = std::fs::read_to_string(&key_file).unwrap();
    let new = format!(
        "[[keys]]\nname = \"key2\"\nsecret = \"{}\"\n{old}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [4u8; 32])
    );
    std::fs::write(&key_file, new).unwrap();
    close(s).await;
    let s = Store::open(d.path()).unwrap();
    let rev = s.revision();
    let r = s.reseal(10).await.unwrap();
    assert_eq!((r.rewritten, r.skipped, s.revision()), (1, 0, rev + 1));
    assert_eq!(counts(&s), [("key2".to_string(), 1)].into());
    assert_eq!(s.reseal(10).await.unwrap(), Resealed::default());
    let after = s.get(&secret, Some("default"), "s").unwrap();
    assert_eq!(after["data"], o["data"]);
    // Without the key it needs, the store does not open and says which key.
    close(s).await;
    std::fs::write(&key_file, old).unwrap();
    let e = format!("{:#}", Store::open(d.path()).err().unwrap());
    assert!(
        e.contains("/core/secrets/default/s is encrypted with key \"key2\""),
        "{e}"
    );
    assert!(!e.contains("pl41nmarker"), "{e}");
}

async fn close(s: Store) {
    tokio::task::spawn_blocking(move || s.close())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_mac_or_uuid_belongs_to_one_server() {
    let (_d, s) = store();
    let srv = rt("server");
    let server = |name: &str, uuid: &str, mac: &str| {
        json!({"metadata": {"name": name}, "spec": {"systemUUID": uuid},
            "status": {"networkInterfaces": [{"name": "eth0", "macAddress": mac}]}})
    };
    let u = |n: u8| format!("4c4c4544-0000-0000-0000-0000000000{n:02x}");
    s.create(&srv, server("a", &u(1), "52:54:00:00:00:01"))
        .await
        .unwrap();
    let conflict = |r: Result<Arc<Value>>| match r {
        Err(StoreError::Conflict { message, .. }) => message,
        other => panic!("{other:?}"),
    };
    let m = conflict(
        s.create(&srv, server("b", &u(2), "52-54-00-00-00-01"))
            .await,
    );
    assert!(
        m.contains("52:54:00:00:00:01") && m.contains("\"a\""),
        "{m}"
    );
    let m = conflict(
        s.create(&srv, server("b", &u(1).to_uppercase(), "52:54:00:00:00:02"))
            .await,
    );
    assert!(m.contains("systemUUID"), "{m}");
    let b = s
        .create(&srv, server("b", &u(2), "52:54:00:00:00:02"))
        .await
        .unwrap();
    // A write that adds a's MAC to b is refused; one that keeps b's keys is not.
    let taken = json!({"networkInterfaces": [{"name": "eth0", "macAddress": "52:54:00:00:00:02"},
        {"name": "eth1", "macAddress": "52:54:00:00:00:01"}]});
    conflict(s.update_status(&srv, &b, taken.clone()).await);
    let b = s
        .update_status(&srv, &b, json!({"state": "Available", "networkInterfaces": [{"name": "eth0", "macAddress": "52:54:00:00:00:02"}]}))
        .await
        .unwrap();
    // Once a is gone, its MAC is free.
    s.delete(&srv, None, "a", None).await.unwrap();
    s.update_status(&srv, &b, taken).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_racing_on_one_mac_leave_one_holder_and_holders_name_it() {
    let (_d, s) = store();
    let s = Arc::new(s);
    let srv = rt("server");
    for round in 0..20u8 {
        let mac = format!("52:54:00:00:01:{round:02x}");
        let tasks: Vec<_> = (0..8u8)
            .map(|i| {
                let (s, srv, mac) = (s.clone(), srv.clone(), mac.clone());
                tokio::spawn(async move {
                    let obj = json!({"metadata": {"name": format!("r{round}-{i}")},
                        "spec": {"systemUUID": format!("4c4c4544-0000-0000-{round:04x}-0000000000{i:02x}")},
                        "status": {"networkInterfaces": [{"name": "eth0", "macAddress": mac}]}});
                    s.create(&srv, obj).await.is_ok()
                })
            })
            .collect();
        let mut won = 0;
        for t in tasks {
            won += t.await.unwrap() as usize;
        }
        assert_eq!(won, 1, "round {round}: {won} servers hold {mac}");
        let m = bootplane_model::ident::parse_mac(&mac).unwrap();
        let held = s.mac_holders(&srv, "someone-else", &[m, [2, 0, 0, 0, 0, 1]]);
        assert_eq!(held.len(), 1, "{held:?}");
        assert!(held[0].1.starts_with(&format!("r{round}-")), "{held:?}");
    }
}

#[tokio::test]
async fn a_key_being_added_is_refused_until_its_write_ends() {
    let (_d, s) = store();
    let srv = rt("server");
    let obj = |n: &str, u: u8, mac: &str| {
        json!({"metadata": {"name": n},
            "spec": {"systemUUID": format!("4c4c4544-0000-0000-0000-0000000000{u:02x}")},
            "status": {"networkInterfaces": [{"name": "eth0", "macAddress": mac}]}})
    };
    let held = s.check_unique(&srv, &obj("a", 1, "52:54:00:00:02:01"), None);
    let held = held
        .ok()
        .flatten()
        .expect("a write adding keys claims them");
    let refused = |r: Result<Option<unique::Held>>| match r {
        Err(StoreError::Conflict { message, .. }) => message,
        Ok(_) => panic!("passed"),
        Err(e) => panic!("{e:?}"),
    };
    let m = refused(s.check_unique(&srv, &obj("b", 2, "52:54:00:00:02:01"), None));
    assert!(m.contains("being registered to server \"a\""), "{m}");
    let m = refused(s.check_unique(&srv, &obj("b", 1, "52:54:00:00:02:02"), None));
    assert!(m.contains("systemUUID"), "{m}");
    // Other keys, and the same write's object again, pass beside it.
    assert!(s
        .check_unique(&srv, &obj("b", 2, "52:54:00:00:02:02"), None)
        .is_ok());
    assert!(s
        .check_unique(&srv, &obj("a", 1, "52:54:00:00:02:01"), None)
        .is_ok());
    drop(held);
    assert!(s
        .check_unique(&srv, &obj("b", 2, "52:54:00:00:02:01"), None)
        .is_ok());
}

#[tokio::test]
async fn dry_run_writes_are_checked_answered_and_not_stored() {
    let (_d, s) = store();
    let dry = s.dry_run();
    assert!(dry.is_dry_run() && !s.is_dry_run());
    let srv = rt("server");
    let uuid = "4c4c4544-0000-0000-0000-0000000000d1";
    let rev = s.revision();
    // Create: the object as it would be (defaults, uid), nothing stored.
    let o = dry
        .create(
            &srv,
            json!({"metadata": {"name": "d"}, "spec": {"systemUUID": uuid}}),
        )
        .await
        .unwrap();
    assert_eq!(o["spec"]["reclaimPolicy"], "Recycle");
    assert!(o["metadata"].get("resourceVersion").is_none(), "{o}");
    assert!(matches!(
        s.get(&srv, None, "d"),
        Err(StoreError::NotFound { .. })
    ));
    // Invalid input is refused as a real write would be.
    let err = (dry.create(
        &srv,
        json!({"metadata": {"name": "d"}, "spec": {"systemUUID": 5}}),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    let big = json!({"metadata": {"name": "big"}, "stringData": {"k": "x".repeat(1200 << 10)}});
    let err = dry.create(&rt("secret"), big).await.unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    let real = s
        .create(
            &srv,
            json!({"metadata": {"name": "d"}, "spec": {"systemUUID": uuid}}),
        )
        .await
        .unwrap();
    let after_create = s.revision();
    assert_eq!(after_create, rev + 1, "the dry writes committed nothing");
    let err = (dry.create(
        &srv,
        json!({"metadata": {"name": "d"}, "spec": {"systemUUID": uuid}}),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    // Update and patch: the new object with the stored version; a stale version conflicts.
    let mut upd = (*real).clone();
    upd["spec"]["power"] = json!("On");
    let o = dry.update(&srv, upd.clone(), Part::Main).await.unwrap();
    assert_eq!(
        (
            o["spec"]["power"].as_str(),
            &o["metadata"]["resourceVersion"]
        ),
        (Some("On"), &real["metadata"]["resourceVersion"])
    );
    assert_eq!(o["metadata"]["generation"], 2);
    let o = dry
        .patch(
            &srv,
            None,
            "d",
            &json!({"spec": {"power": "Off"}}),
            Part::Main,
        )
        .await
        .unwrap();
    assert_eq!(o["spec"]["power"], "Off");
    s.patch(
        &srv,
        None,
        "d",
        &json!({"metadata": {"labels": {"a": "b"}}}),
        Part::Main,
    )
    .await
    .unwrap();
    let err = dry.update(&srv, upd, Part::Main).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    // Delete: answered, still there.
    let gone = dry.delete(&srv, None, "d", None).await.unwrap();
    assert_eq!(meta::name(&gone), "d");
    let kept = s.get(&srv, None, "d").unwrap();
    assert!(kept["spec"].get("power").is_none() && kept["metadata"]["labels"]["a"] == "b");
    assert_eq!(s.revision(), after_create + 1, "only the one real patch");
}

#[tokio::test]
async fn pages_in_key_order_parse_only_what_they_show() {
    let (_d, s) = store();
    let claim = rt("serverclaim");
    for (ns, n) in [("b", "x"), ("a", "z"), ("a-b", "y"), ("a", "y"), ("b", "w")] {
        let o = json!({"metadata": {"name": n, "namespace": ns, "labels": {"n": n}},
            "spec": {"image": "i", "power": "On"}});
        s.create(&claim, o).await.unwrap();
    }
    let names = |p: &Page| -> Vec<String> {
        (p.items.iter())
            .map(|o| format!("{}/{}", meta::namespace(o).unwrap(), meta::name(o)))
            .collect()
    };
    // Every namespace, two to a page, until the last.
    let mut all = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let p = s.list_page(&claim, (None, None), (after.as_deref(), 2), None);
        all.extend(names(&p));
        pages += 1;
        match p.next {
            Some(n) => {
                assert_eq!(p.remaining, Some(5 - all.len()));
                after = Some(n);
            }
            None => break assert_eq!(p.remaining, None),
        }
    }
    assert_eq!(pages, 3);
    let mut sorted = all.clone();
    sorted.sort_by_key(|k| {
        claim.key(
            k.split_once('/').map(|(a, _)| a),
            k.split_once('/').unwrap().1,
        )
    });
    assert_eq!(all, sorted, "key order");
    assert_eq!(all.len(), 5);
    // One namespace; a selector and a filter: no count, pages end at their last match.
    let p = s.list_page(&claim, (Some("a"), None), (None, 10), None);
    assert_eq!(names(&p), ["a/y", "a/z"]);
    let sel = Selector::parse("n in (y,w)").unwrap();
    let p = s.list_page(&claim, (None, Some(&sel)), (None, 1), None);
    // ("a-b/" sorts before "a/": the keys' order, '-' before '/'.)
    assert_eq!((names(&p), p.remaining), (vec!["a-b/y".to_string()], None));
    let next = p.next.unwrap();
    let keep = |o: &Value| meta::namespace(o) != Some("a");
    let p = s.list_page(&claim, (None, Some(&sel)), (Some(&next), 1), Some(&keep));
    assert_eq!(names(&p), ["b/w"]);
    assert!(p.next.is_none());
    // A token past the end, or any text: an empty page or the objects after it.
    let p = s.list_page(&claim, (None, None), (Some("zz"), 5), None);
    assert!(p.items.is_empty() && p.next.is_none());
    let p = s.list_page(&claim, (None, None), (Some("../.."), 5), None);
    assert_eq!(p.items.len(), 5);
}
