//! Unit tests of the Butane translator.

use super::data_url::{
    encode_data_url, url_cache, URL_CACHE_BYTES, URL_CACHE_ENTRIES, URL_SEEN_KEYS,
};
use super::*;

#[test]
fn minimal_per_version() {
    for (v, want) in [
        ("1.3.0", "3.2.0"),
        ("1.4.0", "3.3.0"),
        ("1.5.0", "3.4.0"),
        ("1.6.0", "3.5.0"),
    ] {
        let t = translate(&format!("variant: fcos\nversion: {v}\n")).unwrap();
        assert_eq!(t.config, json!({"ignition": {"version": want}}));
    }
    let t = translate("variant: flatcar\nversion: 1.1.0\n").unwrap();
    assert_eq!(t.version, IgnVersion::V3_4);
}

#[test]
fn deep_or_alias_heavy_butane_is_refused_quickly() {
    // 100k levels of flow nesting took libyaml tens of seconds before the scan.
    let deep = format!("variant: fcos\nversion: 1.5.0\nx: {}", "[".repeat(100_000));
    let t = std::time::Instant::now();
    let e = translate(&deep).unwrap_err().to_string();
    assert!(e.contains("nesting deeper than"), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    let big = "x".repeat(1 << 20);
    let mut bomb = format!("variant: fcos\nversion: 1.5.0\na: &a {big}\nb: [");
    bomb.push_str(&"*a, ".repeat(64));
    bomb.push_str("*a]\n");
    let e = translate(&bomb).unwrap_err().to_string();
    assert!(e.contains("aliases expand"), "{e}");
}

#[test]
fn data_urls_like_butane() {
    assert_eq!(
        data_url(b"hello world\n", true),
        ("data:,hello%20world%0A".to_string(), "")
    );
    let bin = [0u8, 1, 2, 250, 251, 252, 253, 254, 255, 0, 1, 2, 3];
    assert!(data_url(&bin, false).0.starts_with("data:;base64,"));
    let big = "all work and no play\n".repeat(100);
    let (u, c) = data_url(big.as_bytes(), true);
    assert_eq!(c, "gzip");
    assert!(u.len() < 200);
}

#[test]
fn data_url_cache_is_exact_and_bounded() {
    let text = "same file on every machine, same file on every machine\n".repeat(20);
    let direct = encode_data_url(text.as_bytes(), true);
    assert_eq!(direct.1, "gzip");
    assert_eq!(data_url(text.as_bytes(), true), direct);
    assert_eq!(data_url(text.as_bytes(), true), direct);
    // Forced gzip of the same bytes is its own entry (no compression value mix-up).
    let t = translate(&format!(
            "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      contents:\n        compression: gzip\n        inline: {:?}\n    - path: /b\n      contents:\n        inline: {:?}\n",
            "x", text
        ))
        .unwrap();
    let files = &t.config["storage"]["files"];
    assert_eq!(files[0]["contents"]["compression"], "gzip");
    assert_eq!(files[1]["contents"]["source"], direct.0.as_str());
    let forced = data_url(b"x", true);
    assert_eq!(forced, ("data:,x".to_string(), ""));
    // Short contents bypass the cache and still encode as before.
    assert_eq!(
        data_url(b"0123456789abc", true),
        encode_data_url(b"0123456789abc", true)
    );
    for i in 0..URL_CACHE_ENTRIES + 50 {
        let d = format!("distinct contents number {i} ..........");
        for _ in 0..3 {
            assert_eq!(
                data_url(d.as_bytes(), true),
                encode_data_url(d.as_bytes(), true)
            );
        }
    }
    let c = url_cache().lock().unwrap_or_else(|e| e.into_inner());
    assert!(c.cur.len() <= URL_CACHE_ENTRIES && c.old.len() <= URL_CACHE_ENTRIES);
    assert!(c.cur_bytes <= URL_CACHE_BYTES);
    assert!(c.seen.len() <= URL_SEEN_KEYS);
}

#[test]
fn modes_octal_strings_and_errors() {
    let t = translate("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      mode: 0644\n    - path: /b\n      mode: 0o755\n    - path: /c\n      mode: 420\n").unwrap();
    let modes: Vec<i64> = t.config["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["mode"].as_i64().unwrap())
        .collect();
    assert_eq!(modes, vec![0o644, 0o755, 420]);
    let e = translate(
        "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      mode: 0999\n",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("storage.files[0].mode (line 6, column 7)"),
        "{e}"
    );
    let e = translate(
        "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      mode: 99999\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("must be between 0 and 07777"), "{e}");
}

#[test]
fn unknown_and_unsupported_fields_name_path_and_line() {
    let e = translate(
        "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      colour: blue\n",
    )
    .unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("storage.files[0]") && s.contains("colour") && s.contains("line 6"),
        "{s}"
    );
    let e =
        translate("variant: fcos\nversion: 1.3.0\nkernel_arguments:\n  should_exist: [quiet]\n")
            .unwrap_err();
    assert!(
        e.to_string().contains(
            "kernel_arguments (line 3, column 1): not supported in fcos 1.3.0 (needs fcos 1.4.0"
        ),
        "{e}"
    );
    let e = translate("variant: fcos\nversion: 1.5.0\ngrub:\n  users: []\n").unwrap_err();
    assert!(e.to_string().contains("grub (line 3"), "{e}");
}

#[test]
fn variant_version_errors() {
    assert!(matches!(
        translate("variant: rhcos\nversion: 1.5.0\n"),
        Err(Error::UnknownVariant(_))
    ));
    assert!(matches!(
        translate("variant: fcos\nversion: 1.7.0\n"),
        Err(Error::UnsupportedVersion { .. })
    ));
    assert!(matches!(
        translate("variant: fcos\nversion: 1.2.0\n"),
        Err(Error::UnsupportedVersion { .. })
    ));
    assert!(matches!(
        translate("variant: fcos\n"),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(translate("variant: [fcos\n"), Err(Error::Yaml(_))));
    assert!(translate("").is_err());
    assert!(matches!(translate("- a\n- b\n"), Err(Error::Yaml(_))));
}

#[test]
fn duplicate_and_relative_paths_have_lines() {
    let y = "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/a\n  directories:\n    - path: /etc/a\n  links:\n    - path: etc/b\n      target: /x\n";
    let e = translate(y).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("storage.directories[0].path (line 7, column 7): duplicate path \"/etc/a\""),
        "{s}"
    );
    assert!(
        s.contains("storage.links[0].path (line 9, column 7): path \"etc/b\" must be absolute"),
        "{s}"
    );
}

#[test]
fn local_contents_and_trees_come_from_files_dir() {
    let mut fd = FilesDir::new();
    fd.file("motd", "hi\n", false)
        .dir("tree")
        .file("tree/bin/run", "#!/bin/sh\n", true)
        .symlink("tree/cur", "bin/run");
    let y = "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/motd\n      contents:\n        local: motd\n  trees:\n    - local: tree\n      path: /opt/t\n";
    let t = translate_with(y, &fd).unwrap();
    let st = &t.config["storage"];
    assert_eq!(st["files"][0]["contents"]["source"], "data:,hi%0A");
    assert_eq!(st["files"][1]["path"], "/opt/t/bin/run");
    assert_eq!(st["files"][1]["mode"], 0o755);
    assert_eq!(
        st["links"][0],
        json!({"path": "/opt/t/cur", "target": "bin/run"})
    );
    let e = translate(y).unwrap_err();
    assert!(
        e.to_string()
            .contains("storage.files[0].contents.local (line 7"),
        "{e}"
    );
}

#[test]
fn escape() {
    assert_eq!(systemd_escape_path("/var/lib/x-y"), "var-lib-x\\x2dy");
    assert_eq!(
        systemd_escape_path("/dev/disk/by-label/var"),
        "dev-disk-by\\x2dlabel-var"
    );
    assert_eq!(systemd_escape_path("/"), "-");
}

#[test]
fn butane_paths() {
    assert_eq!(
        to_butane_path("storage.disks[0].partitions[1].sizeMiB"),
        "storage.disks[0].partitions[1].size_mib"
    );
    assert_eq!(
        to_butane_path("systemd.units[3].dropins[0].name"),
        "systemd.units[3].dropins[0].name"
    );
    assert_eq!(
        to_butane_path("passwd.users[0].sshAuthorizedKeys"),
        "passwd.users[0].ssh_authorized_keys"
    );
}
