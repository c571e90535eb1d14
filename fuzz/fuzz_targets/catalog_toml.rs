//! Fuzz `images/catalog.toml` parsing (`Catalog::parse`) and what the boot side does
//! with an accepted catalog: resolve every image with all files present, build its
//! boot URLs. Checks: every URL a valid catalog produces is one the boot listener
//! serves (its path passes `files::sanitize` and names the catalog's file under
//! `images/`), and resolution with matching digests succeeds.
#![no_main]

use std::collections::HashMap;

use bootplane::http::catalog::{Catalog, FileFact};
use bootplane::http::files::sanitize;
use libfuzzer_sys::fuzz_target;

const BASE: &str = "http://10.0.0.1:8080";

fn served(url: &str, want: &str) {
    let rest = url
        .strip_prefix(BASE)
        .and_then(|r| r.strip_prefix("/assets/"))
        .unwrap_or_else(|| panic!("{url} is not under /assets/"));
    let uri: http::Uri = url.parse().unwrap_or_else(|e| panic!("{url:?} is not a URI: {e}"));
    assert_eq!(uri.path(), format!("/assets/{rest}"));
    match sanitize(rest) {
        Ok(p) => assert_eq!(p, format!("images/{want}")),
        Err(e) => panic!("catalog path {want:?} gives URL {url:?}, which the boot listener refuses: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(c) = Catalog::parse(text) else { return };
    for img in &c.images {
        let mut facts = HashMap::new();
        let mut files = vec![&img.kernel, &img.initrd];
        files.extend(img.rootfs.as_ref());
        for f in &files {
            facts.insert(
                f.path.clone(),
                FileFact::Present {
                    sha256: f.sha256.to_ascii_lowercase(),
                },
            );
        }
        let Ok(r) = c.resolve(&img.reference, &facts) else {
            // Two roles naming one path with different digests cannot both match.
            continue;
        };
        let b = r.boot_files(BASE);
        served(&b.kernel_url, &r.kernel);
        served(&b.initrd_url, &r.initrd);
        if let Some(p) = &r.rootfs {
            served(&b.rootfs_url, p);
        }
    }
});
