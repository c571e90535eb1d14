//! The `[provision.jobs]` allow-lists: globs, `..`, symbolic links out of the file
//! target directory, sources and the required checksum.

use super::*;
use crate::provision::NfsSource;

fn req(target: &str) -> ProvisionRequest {
    ProvisionRequest {
        id: None,
        server: "m1".into(),
        image: None,
        nfs: Some(NfsSource {
            server: "10.0.0.1".into(),
            export: "/images/default/demo".into(),
            path: "disk.img".into(),
        }),
        source: None,
        sha256: Some("a".repeat(64)),
        manifest: None,
        target: target.into(),
        resolved_target: None,
    }
}

fn policy(dir: Option<&Path>, place: Where) -> Policy {
    Policy {
        jobs: JobsConfig {
            target_dir: dir.map(Path::to_path_buf),
            sources: vec!["http://images.example:8080/pub/".into()],
            ..Default::default()
        },
        nfs_server: "10.0.0.1".into(),
        place,
    }
}

fn refused(p: &Policy, r: &ProvisionRequest) -> bool {
    matches!(p.check(r), Err(JobError::Forbidden(_)))
}

#[test]
fn globs() {
    let g = "/dev/disk/by-id/*";
    assert!(glob_match(g, "/dev/disk/by-id/wwn-0x5000"));
    assert!(
        glob_match(g, "/dev/disk/by-id/"),
        "an empty name (refused as a path)"
    );
    assert!(!glob_match(g, "/dev/disk/by-id/a/b"), "* stops at /");
    assert!(!glob_match(g, "/dev/disk/by-idx/a"));
    assert!(!glob_match(g, "/etc/passwd"));
    assert!(glob_match("/dev/dasd?", "/dev/dasda"));
    assert!(!glob_match("/dev/dasd?", "/dev/dasdab"));
    assert!(!glob_match("/dev/dasd?", "/dev/dasd/"));
    assert!(glob_match("/dev/*-part*", "/dev/nvme0n1-part2"));
    assert!(!glob_match("/dev/*", "/dev/disk/by-id/x"));
    assert!(glob_match("*", ""));
}

#[test]
fn device_targets_checked_lexically_elsewhere() {
    let p = policy(None, Where::Elsewhere);
    let ok = p.check(&req("/dev/disk/by-path/ccw-0.0.0100")).unwrap();
    assert_eq!(ok.resolved_target, None);
    for t in [
        "/dev/disk/by-id/../../../etc/passwd",
        "/dev/disk/by-id/./x",
        "/dev/sda",
        "/etc/cron.d/x",
        "/dev/disk/by-id//x",
        "/dev/disk/by-id/",
    ] {
        assert!(refused(&p, &req(t)), "{t}");
    }
    assert!(matches!(
        p.check(&req("relative")),
        Err(JobError::Invalid(_))
    ));
}

#[test]
fn device_target_must_resolve_to_a_block_device_here() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("by-id");
    std::fs::create_dir(&link).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", link.join("evil")).unwrap();
    let mut p = policy(None, Where::Here);
    p.jobs.target_devices = vec![format!("{}/*", link.display())];
    // A glob below /dev/ is what validate() allows; the check itself still refuses a
    // match that resolves to anything but a block device.
    assert!(refused(&p, &req(&link.join("evil").display().to_string())));
    assert!(refused(
        &p,
        &req(&link.join("missing").display().to_string())
    ));
}

#[test]
fn file_targets_only_inside_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("targets");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();
    std::fs::write(outside.join("f"), b"x").unwrap();
    std::os::unix::fs::symlink(outside.join("f"), dir.join("link.img")).unwrap();
    let p = policy(Some(&dir), Where::Here);
    let t = |s: &str| dir.join(s).display().to_string();

    let ok = p.check(&req(&t("disk.img"))).unwrap();
    let real_dir = std::fs::canonicalize(&dir).unwrap();
    assert_eq!(
        ok.resolved_target,
        Some(real_dir.join("disk.img").display().to_string())
    );
    assert!(ok
        .provision_args(String::new())
        .contains(&"--no-follow-target".to_string()));
    p.check(&req(&t("sub/disk.img"))).unwrap();
    for bad in [
        t("escape/disk.img"), // directory link out of it
        t("link.img"),        // the file itself a link
        t("../outside/f"),    // ..
        t("sub/../../outside/f"),
        t("missing-dir/disk.img"),
        dir.display().to_string(),
        outside.join("f").display().to_string(),
        "/etc/cron.d/x".into(),
    ] {
        assert!(refused(&p, &req(&bad)), "{bad}");
    }
    // Without a directory configured, no file target at all.
    assert!(refused(&policy(None, Where::Here), &req(&t("disk.img"))));
    // Elsewhere the path is only checked as written.
    let e = policy(Some(&dir), Where::Elsewhere);
    assert_eq!(e.check(&req(&t("disk.img"))).unwrap().resolved_target, None);
    assert!(refused(&e, &req(&t("../outside/f"))));
}

#[test]
fn sources_and_checksum() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(Some(tmp.path()), Where::Elsewhere);
    let target = tmp.path().join("d.img").display().to_string();
    p.check(&req(&target)).unwrap();

    let mut r = req(&target);
    r.sha256 = None;
    assert!(refused(&p, &r), "no pinned checksum");

    let with_source = |s: &str| {
        let mut r = req(&target);
        r.nfs = None;
        r.source = Some(s.into());
        r
    };
    p.check(&with_source("http://images.example:8080/pub/demo.img.zst"))
        .unwrap();
    p.check(&with_source("http://images.example:8080/pub/a/b.img?sig=1"))
        .unwrap();
    for bad in [
        "http://images.example:8080/pub",
        "http://images.example:8080/pub/",
        "http://images.example:8080/pubx/a.img",
        "http://images.example:8080/pub/../secret",
        "http://images.example:8080/pub/%2e%2e/secret",
        "http://images.example:8080/pub/a%2fb",
        "http://images.example:8080@evil.example/pub/a.img",
        "http://images.example/pub/a.img",
        "https://images.example:8080/pub/a.img",
        "/var/lib/bootplane/secrets.key",
        "nfs://10.0.0.9/images/a.img",
    ] {
        assert!(refused(&p, &with_source(bad)), "{bad}");
    }
    // NFS: the appliance's own server, or a configured base.
    let mut r = req(&target);
    r.nfs.as_mut().unwrap().server = "10.0.0.9".into();
    assert!(refused(&p, &r));
    let mut p2 = p.clone();
    p2.jobs.sources = vec!["nfs://10.0.0.9/images".into()];
    p2.check(&r).unwrap();
    r.nfs.as_mut().unwrap().export = "/imagesx".into();
    assert!(refused(&p2, &r));
}

#[test]
fn config_validation() {
    JobsConfig::default().validate().unwrap();
    let bad = [
        JobsConfig {
            target_devices: vec!["/etc/*".into()],
            ..Default::default()
        },
        JobsConfig {
            target_devices: vec!["/dev/../etc/*".into()],
            ..Default::default()
        },
        JobsConfig {
            target_dir: Some("relative".into()),
            ..Default::default()
        },
        JobsConfig {
            target_dir: Some("/".into()),
            ..Default::default()
        },
        JobsConfig {
            sources: vec!["ftp://x/".into()],
            ..Default::default()
        },
        JobsConfig {
            sources: vec!["http://x/a/../b".into()],
            ..Default::default()
        },
    ];
    for c in bad {
        assert!(c.validate().is_err(), "{c:?}");
    }
}
