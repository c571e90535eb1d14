//! Bad Butane / Ignition input gets a clear error naming the field and the line, and
//! never a panic (also for every truncation of every corpus file).

use std::path::Path;

use bootplane::ignition::{self, Error, FilesDir};

fn err(src: &str) -> String {
    match ignition::translate(src) {
        Ok(t) => panic!("accepted bad input:\n{src}\n=> {}", t.config),
        Err(e) => e.to_string(),
    }
}

fn has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} lacks {p:?}");
    }
}

#[test]
fn invalid_yaml_has_line_and_column() {
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files: [\n    - path: /a\n");
    has(&m, &["invalid butane", "line"]);
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n\tfiles: []\n");
    has(&m, &["line 4"]);
}

#[test]
fn unknown_variant_and_unsupported_versions() {
    has(
        &err("variant: rhcos\nversion: 1.5.0\n"),
        &["unknown butane variant \"rhcos\"", "fcos, flatcar"],
    );
    has(
        &err("variant: fcos\nversion: 1.2.0\n"),
        &["unsupported fcos version \"1.2.0\"", "1.3.0"],
    );
    has(
        &err("variant: fcos\nversion: 1.7.0-experimental\n"),
        &["unsupported fcos version"],
    );
    has(
        &err("variant: flatcar\nversion: 1.4.0\n"),
        &["unsupported flatcar version"],
    );
    has(&err("version: 1.5.0\n"), &["variant: missing"]);
    has(&err("variant: fcos\n"), &["version", "missing"]);
}

#[test]
fn unknown_field_names_path_and_line() {
    let m = err("variant: fcos\nversion: 1.5.0\nsystemd:\n  units:\n    - name: a.service\n      enable: true\n");
    has(
        &m,
        &["systemd.units[0]", "unknown field `enable`", "line 6"],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nstorge:\n  files: []\n");
    has(&m, &["unknown field `storge`", "line 3"]);
}

#[test]
fn fields_newer_than_the_spec_version_are_errors_with_line() {
    let m = err("variant: fcos\nversion: 1.4.0\nstorage:\n  luks:\n    - name: a\n      device: /dev/vdb\n      discard: true\n");
    has(
        &m,
        &[
            "storage.luks[0].discard (line 7, column 7)",
            "needs fcos 1.5.0",
        ],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  luks:\n    - name: a\n      device: /dev/vdb\n      cex:\n        enabled: true\n");
    has(&m, &["storage.luks[0].cex (line 7", "needs fcos 1.6.0"]);
    let m = err("variant: flatcar\nversion: 1.0.0\nboot_device:\n  mirror:\n    devices: [/dev/a, /dev/b]\n");
    has(&m, &["boot_device (line 3", "flatcar"]);
}

#[test]
fn duplicate_paths() {
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/x\n    - path: /etc/y\n  links:\n    - path: /etc/x/\n      target: /z\n");
    has(
        &m,
        &[
            "storage.links[0].path (line 8, column 7)",
            "duplicate path",
            "storage.files[0]",
        ],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nsystemd:\n  units:\n    - name: a.service\n    - name: a.service\n");
    has(&m, &["systemd.units[1].name (line 6", "duplicate unit"]);
}

#[test]
fn relative_paths() {
    let m = err("variant: fcos\nversion: 1.6.0\nstorage:\n  directories:\n    - path: var/lib/x\n");
    has(
        &m,
        &[
            "storage.directories[0].path (line 5, column 7)",
            "must be absolute",
        ],
    );
    let m = err("variant: fcos\nversion: 1.6.0\nstorage:\n  filesystems:\n    - device: /dev/vdb\n      path: var\n      format: xfs\n");
    has(
        &m,
        &["storage.filesystems[0].path (line 6", "must be absolute"],
    );
}

#[test]
fn bad_modes() {
    let m = err(
        "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      mode: 0o17777\n",
    );
    has(
        &m,
        &[
            "storage.files[0].mode (line 6, column 7)",
            "between 0 and 07777",
        ],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  directories:\n    - path: /a\n      mode: rwxr-xr-x\n");
    has(&m, &["storage.directories[0].mode (line 6", "octal"]);
    let m =
        err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      mode: -1\n");
    has(&m, &["storage.files[0].mode"]);
}

#[test]
fn bad_urls_hashes_and_sources() {
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      contents:\n        source: ftp://host/x\n");
    has(
        &m,
        &[
            "storage.files[0].contents.source (line 7",
            "unsupported scheme",
        ],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      contents:\n        source: http://h/x\n        verification:\n          hash: md5-abc\n");
    has(
        &m,
        &[
            "storage.files[0].contents.verification.hash (line 9",
            "sha512",
        ],
    );
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      contents:\n        source: http://h/x\n        inline: y\n");
    has(&m, &["storage.files[0].contents (line 6", "only one of"]);
    let m = err("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /a\n      contents:\n        local: ../../etc/shadow\n");
    has(
        &m,
        &["storage.files[0].contents.local (line 7", "stay inside"],
    );
}

#[test]
fn tree_conflicts_and_bad_local_child_configs() {
    let mut files = FilesDir::new();
    files
        .dir("t")
        .file("t/a", "x", false)
        .file("child.ign", "{not json", false);
    let y = "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /opt/a\n      contents:\n        inline: y\n  trees:\n    - local: t\n      path: /opt\n";
    let e = ignition::translate_with(y, &files).unwrap_err().to_string();
    has(
        &e,
        &[
            "storage.trees[0] (line 9",
            "a node already exists at \"/opt/a\"",
        ],
    );
    let y = "variant: fcos\nversion: 1.5.0\nignition:\n  config:\n    merge:\n      - local: child.ign\n";
    let e = ignition::translate_with(y, &files).unwrap_err().to_string();
    has(
        &e,
        &[
            "ignition.config.merge[0].local (line 6",
            "not a valid ignition config",
        ],
    );
}

#[test]
fn bad_ignition_json() {
    let e = ignition::validate::parse_json(
        "{\"ignition\": {\"version\": \"3.3.0\"},\n  \"storage\": [}",
    )
    .unwrap_err();
    has(&e.to_string(), &["line 2"]);
    let v: serde_json::Value = serde_json::from_str(r#"{"ignition":{"version":"3.6.0"}}"#).unwrap();
    assert!(matches!(
        ignition::validate(&v),
        Err(Error::UnsupportedIgnitionVersion(_))
    ));
    let v: serde_json::Value = serde_json::from_str(
        r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/a","mode":"0644"}]}}"#,
    )
    .unwrap();
    has(
        &ignition::validate(&v).unwrap_err().to_string(),
        &["storage.files[0].mode"],
    );
}

#[test]
fn no_panic_on_any_truncation_or_garbage() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/butane");
    let files = FilesDir::read_dir(&dir.join("files")).unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "bu") {
            continue;
        }
        let src = std::fs::read_to_string(&p).unwrap();
        let mut cuts: Vec<usize> = src.char_indices().map(|(i, _)| i).step_by(7).collect();
        cuts.push(src.len());
        for cut in cuts {
            let _ = ignition::translate_with(&src[..cut], &files);
            n += 1;
        }
        // Swap every line with garbage, one at a time.
        let lines: Vec<&str> = src.lines().collect();
        for i in 0..lines.len() {
            let mut l = lines.clone();
            l[i] = "  - ]:{ !!binary &a *b";
            let _ = ignition::translate_with(&l.join("\n"), &files);
            n += 1;
        }
    }
    assert!(n > 500);
    for g in [
        "",
        "\0",
        "---\n---\n",
        "[]",
        "variant: fcos\nversion: 1.5.0\n<<: *x\n",
        "variant: fcos\nversion: 1.5.0\nstorage: &a\n  files: *a\n",
    ] {
        let _ = ignition::translate(g);
    }
}
