//! /assets/ per RFC 9110 with the real curl: HEAD, single and multipart ranges,
//! 416, ETag/If-None-Match, If-Modified-Since, If-Range, If-Match; `.efi` with the
//! right type and length and never a redirect (also Debian's iPXE binaries).

use crate::support;

use bootplane::http::server::Limits;
use support::http::*;

fn blob(srv: &Srv) -> Vec<u8> {
    std::fs::read(srv.dir.path().join("assets/sub/blob.bin")).unwrap()
}

#[test]
fn head_and_full_get() {
    let srv = start(Limits::default(), |_| {});
    let url = format!("{}/assets/sub/blob.bin", srv.base);
    let head = curl(OTHER_IP, &url, &["-I"]);
    assert_eq!(head.code, 200);
    assert_eq!(head.header("content-length").as_deref(), Some("3000000"));
    assert_eq!(head.header("accept-ranges").as_deref(), Some("bytes"));
    assert!(head.header("etag").unwrap().starts_with('"'));
    assert!(head.header("last-modified").unwrap().ends_with("GMT"));
    let get = curl(OTHER_IP, &url, &[]);
    assert_eq!(get.code, 200);
    assert_eq!(get.body, blob(&srv));
    assert_eq!(get.header("etag"), head.header("etag"));
    // HEAD ignores Range (defined for GET only).
    assert_eq!(
        curl(OTHER_IP, &url, &["-I", "-H", "Range: bytes=0-9"]).code,
        200
    );
}

#[test]
fn single_and_multipart_ranges() {
    let srv = start(Limits::default(), |_| {});
    let url = format!("{}/assets/sub/blob.bin", srv.base);
    let data = blob(&srv);
    let r = curl(OTHER_IP, &url, &["-r", "100-1099"]);
    assert_eq!(r.code, 206);
    assert_eq!(
        r.header("content-range").as_deref(),
        Some("bytes 100-1099/3000000")
    );
    assert_eq!(r.header("content-length").as_deref(), Some("1000"));
    assert_eq!(r.body, &data[100..1100]);
    let suffix = curl(OTHER_IP, &url, &["-H", "Range: bytes=-500"]);
    assert_eq!(
        (suffix.code, suffix.body.as_slice()),
        (206, &data[2_999_500..])
    );
    let open = curl(OTHER_IP, &url, &["-H", "Range: bytes=2999990-"]);
    assert_eq!(
        open.header("content-range").as_deref(),
        Some("bytes 2999990-2999999/3000000")
    );

    let m = curl(OTHER_IP, &url, &["-r", "0-9,2000000-2000009"]);
    assert_eq!(m.code, 206);
    let ct = m.header("content-type").unwrap();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("{ct}"));
    assert_eq!(
        m.header("content-length")
            .unwrap()
            .parse::<usize>()
            .unwrap(),
        m.body.len()
    );
    let body = m.body.clone();
    let mut parts = Vec::new();
    let delim = format!("--{boundary}");
    let text = unsafe_latin1(&body);
    for chunk in text.split(delim.as_str()).skip(1) {
        if chunk.starts_with("--") {
            break;
        }
        let (head, payload) = chunk.split_once("\r\n\r\n").unwrap();
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: bytes "))
            .unwrap()
            .to_string();
        parts.push((
            range,
            payload
                .strip_suffix("\r\n")
                .unwrap()
                .chars()
                .map(|c| c as u8)
                .collect::<Vec<u8>>(),
        ));
    }
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].0, "0-9/3000000");
    assert_eq!(parts[0].1, &data[0..10]);
    assert_eq!(parts[1].0, "2000000-2000009/3000000");
    assert_eq!(parts[1].1, &data[2_000_000..2_000_010]);

    let bad = curl(OTHER_IP, &url, &["-H", "Range: bytes=3000000-"]);
    assert_eq!(bad.code, 416);
    assert_eq!(
        bad.header("content-range").as_deref(),
        Some("bytes */3000000")
    );
    // A syntactically invalid Range is ignored.
    let ignored = curl(OTHER_IP, &url, &["-H", "Range: bytes=9-1"]);
    assert_eq!((ignored.code, ignored.body.len()), (200, 3_000_000));
}

fn unsafe_latin1(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

#[test]
fn conditional_requests() {
    let srv = start(Limits::default(), |_| {});
    let url = format!("{}/assets/sub/blob.bin", srv.base);
    let first = curl(OTHER_IP, &url, &["-I"]);
    let etag = first.header("etag").unwrap();
    let lm = first.header("last-modified").unwrap();
    let nm = curl(OTHER_IP, &url, &["-H", &format!("If-None-Match: {etag}")]);
    assert_eq!(nm.code, 304);
    assert!(nm.body.is_empty());
    assert_eq!(nm.header("etag").as_deref(), Some(etag.as_str()));
    assert_eq!(
        curl(OTHER_IP, &url, &["-H", "If-None-Match: \"nope\""]).code,
        200
    );
    assert_eq!(
        curl(OTHER_IP, &url, &["-H", &format!("If-Modified-Since: {lm}")]).code,
        304
    );
    assert_eq!(
        curl(
            OTHER_IP,
            &url,
            &[
                "-H",
                "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT",
                "-I"
            ]
        )
        .code,
        200
    );
    // curl's own conditional flag (-z sends If-Modified-Since).
    assert_eq!(curl(OTHER_IP, &url, &["-z", &lm]).code, 304);
    // If-Range: current validator → 206, stale → full 200.
    let ir = curl(
        OTHER_IP,
        &url,
        &["-r", "0-3", "-H", &format!("If-Range: {etag}")],
    );
    assert_eq!((ir.code, ir.body.len()), (206, 4));
    let stale = curl(OTHER_IP, &url, &["-r", "0-3", "-H", "If-Range: \"old\""]);
    assert_eq!((stale.code, stale.body.len()), (200, 3_000_000));
    let by_date = curl(
        OTHER_IP,
        &url,
        &["-r", "0-3", "-H", &format!("If-Range: {lm}")],
    );
    assert_eq!(by_date.code, 206);
    assert_eq!(
        curl(OTHER_IP, &url, &["-H", "If-Match: \"nope\""]).code,
        412
    );
    assert_eq!(
        curl(OTHER_IP, &url, &["-H", &format!("If-Match: {etag}"), "-I"]).code,
        200
    );
}

#[test]
fn efi_without_redirect_with_type_and_length() {
    let srv = start(Limits::default(), |_| {});
    let r = curl(OTHER_IP, &format!("{}/assets/tool.efi", srv.base), &["-L"]);
    assert_eq!((r.code, r.redirects), (200, 0));
    assert_eq!(r.header("content-type").as_deref(), Some("application/efi"));
    assert_eq!(r.header("content-length").as_deref(), Some("200000"));
    assert_eq!(r.body.len(), 200_000);
    // Debian's iPXE binaries, served from /usr/lib/ipxe when the assets dir lacks them.
    for (name, ct) in [
        ("ipxe.efi", "application/efi"),
        ("snponly.efi", "application/efi"),
        ("undionly.kpxe", "application/octet-stream"),
    ] {
        let want =
            std::fs::read(format!("/usr/lib/ipxe/{name}")).expect("Debian package ipxe installed");
        let r = curl(OTHER_IP, &format!("{}/assets/{name}", srv.base), &["-L"]);
        assert_eq!((r.code, r.redirects), (200, 0), "{name}");
        assert_eq!(r.header("content-type").as_deref(), Some(ct), "{name}");
        assert_eq!(
            r.header("content-length"),
            Some(want.len().to_string()),
            "{name}"
        );
        assert_eq!(r.body, want, "{name}");
    }
    // A directory is never listed nor redirected to a slash URL.
    let d = curl(OTHER_IP, &format!("{}/assets/sub", srv.base), &[]);
    assert_eq!((d.code, d.redirects), (404, 0));
    assert!(d.header("location").is_none());
}

#[test]
fn read_and_mmap_modes_serve_identical_bytes() {
    for io in [
        bootplane::http::files::FileIo::Read,
        bootplane::http::files::FileIo::Mmap,
    ] {
        let srv = start(Limits::default(), move |s| s.file_io = io);
        let url = format!("{}/assets/sub/blob.bin", srv.base);
        assert_eq!(curl(OTHER_IP, &url, &[]).body, blob(&srv), "{io:?}");
        assert_eq!(
            curl(OTHER_IP, &url, &["-r", "5-9"]).body,
            &blob(&srv)[5..10],
            "{io:?}"
        );
    }
}
