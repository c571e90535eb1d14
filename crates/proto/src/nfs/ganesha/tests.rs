//! Unit tests of the ganesha backend: ganesha.conf rendering, reload-log parsing and the
//! persisted export table.

use super::*;

fn table() -> ExportTable {
    let mut t = ExportTable {
        next_id: 3,
        exports: BTreeMap::new(),
    };
    t.exports.insert(
        "/images/a".into(),
        ExportEntry {
            id: 1,
            fs_path: "/srv/a".into(),
            rules: vec![
                ExportRule {
                    index: 1,
                    client: "10.0.0.5".parse().unwrap(),
                    access: Access::None,
                    protocols: vec![],
                    superuser: false,
                },
                ExportRule {
                    index: 2,
                    client: "10.0.0.0/24".parse().unwrap(),
                    access: Access::Ro,
                    protocols: vec![Protocol::Nfs3],
                    superuser: false,
                },
                ExportRule {
                    index: 3,
                    client: "fd00::/64".parse().unwrap(),
                    access: Access::Rw,
                    protocols: vec![],
                    superuser: true,
                },
            ],
        },
    );
    t.exports.insert(
        "/images/b".into(),
        ExportEntry {
            id: 2,
            fs_path: "/srv/b".into(),
            rules: vec![],
        },
    );
    t
}

#[test]
fn renders_deny_by_default_and_rules_in_order() {
    let text = render_config(
        &GaneshaConfig::default(),
        Path::new("/var/lib/bp/ganesha"),
        &table(),
    );
    assert!(text.contains("EXPORT_DEFAULTS {\n    Access_Type = None;"));
    assert!(text.contains("RecoveryRoot = \"/var/lib/bp/ganesha/recovery\";"));
    assert!(text.contains("NFS_Port = 2049;"));
    assert!(text.contains("Mount_Path_Pseudo = true;"));
    let a = text.find("Pseudo = \"/images/a\";").unwrap();
    let b = text.find("Pseudo = \"/images/b\";").unwrap();
    assert!(a < b);
    let i1 = text.find("Clients = 10.0.0.5;").unwrap();
    let i2 = text.find("Clients = 10.0.0.0/24;").unwrap();
    let i3 = text.find("Clients = fd00::/64;").unwrap();
    assert!(i1 < i2 && i2 < i3 && i3 < b);
    let block1 = &text[i1..i2];
    assert!(block1.contains("Access_Type = None;"));
    let block2 = &text[i2..i3];
    assert!(
        block2.contains("Access_Type = RO;")
            && block2.contains("Protocols = 3;")
            && block2.contains("Squash = Root_Squash;")
    );
    let block3 = &text[i3..b];
    assert!(
        block3.contains("Access_Type = RW;")
            && block3.contains("Protocols = 3, 4;")
            && block3.contains("No_Root_Squash")
    );
    // Export b has no CLIENT block at all: nobody has access.
    assert!(!text[b..].contains("CLIENT"));
    assert!(text[b..].contains("Access_Type = None;"));
    // Balanced braces.
    assert_eq!(text.matches('{').count(), text.matches('}').count());
}

#[test]
fn rule_for_unserved_protocol_is_dropped() {
    let cfg = GaneshaConfig {
        protocols: vec![Protocol::Nfs3],
        ..Default::default()
    };
    let mut t = table();
    t.exports.get_mut("/images/b").unwrap().rules = vec![ExportRule {
        index: 1,
        client: "10.0.0.9".parse().unwrap(),
        access: Access::Ro,
        protocols: vec![Protocol::Nfs4],
        superuser: false,
    }];
    let text = render_config(&cfg, Path::new("/x"), &t);
    assert!(!text.contains("10.0.0.9"));
    assert!(text.contains("Protocols = 3;"));
}

#[test]
fn reload_problems_ignore_benign_noise() {
    let noise = "x : vm : nfs-ganesha-1[main] gsh_dbus_register_path :DBUS :CRIT :no DBUS connection\n\
                     x : vm : nfs-ganesha-1[sigmgr] reread_exports :CONFIG :EVENT :Reread exports complete\n";
    assert_eq!(reload_problem(noise), None);
    let bad = "x : vm : nfs-ganesha-1[sigmgr] reread_exports :CONFIG :CRIT :Error while parsing new configuration file\n";
    assert!(reload_problem(bad).unwrap().contains("Error while parsing"));
}

#[tokio::test]
async fn table_persists_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    // A backend whose binaries do not exist: table changes are saved, then start fails
    // with a clear reason.
    let cfg = GaneshaConfig {
        ganesha_bin: "/nonexistent/ganesha.nfsd".into(),
        private_run: false,
        manage_rpcbind: false,
        start_timeout_ms: 2_000,
        ..Default::default()
    };
    let g = Ganesha::new(cfg.clone(), dir.path()).unwrap();
    let err = g
        .ensure_export("/images/a", Path::new("/srv/a"))
        .await
        .unwrap_err();
    assert!(matches!(err, NfsError::Down(_)), "{err}");
    assert!(err.to_string().contains("exited during startup"), "{err}");
    assert!(matches!(
        g.ensure_export("relative", Path::new("/srv/a")).await,
        Err(NfsError::InvalidExport(..))
    ));
    assert!(matches!(
        g.ensure_export("/images/c", Path::new("srv")).await,
        Err(NfsError::InvalidExport(..))
    ));
    assert!(matches!(
        g.set_rules("/nope", vec![]).await,
        Err(NfsError::UnknownExport(_))
    ));
    let h = g.health().await.unwrap_err();
    assert!(h.to_string().contains("not running"), "{h}");
    drop(g);
    let g2 = Ganesha::new(cfg, dir.path()).unwrap();
    let inner = g2.inner.lock().await;
    assert_eq!(inner.table.exports.len(), 1);
    assert_eq!(inner.table.exports["/images/a"].id, 1);
    assert_eq!(inner.table.next_id, 2);
}
