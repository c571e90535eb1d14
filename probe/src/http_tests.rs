//! HTTP post tests against a real local `TcpListener`: the request's shape, 2xx, a 4xx
//! that stops at once, 503s that are retried, and URL parsing.

use super::*;
use std::net::TcpListener;
use std::sync::mpsc;

/// A server on 127.0.0.1 answering each connection with the next of `answers`; each
/// request (head + body) is sent back on the channel.
fn server(answers: Vec<&'static str>) -> (u16, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for a in answers {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 4096];
            loop {
                let n = s.read(&mut b).unwrap();
                req.extend_from_slice(&b[..n]);
                let text = String::from_utf8_lossy(&req).into_owned();
                if let Some(i) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap();
                    if req.len() >= i + 4 + len {
                        break;
                    }
                }
            }
            s.write_all(a.as_bytes()).unwrap();
            tx.send(String::from_utf8(req).unwrap()).unwrap();
        }
    });
    (port, rx)
}

#[test]
fn accepted_first_time_with_the_right_request() {
    let (port, rx) = server(vec!["HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"]);
    let url = parse_url(&format!(
        "http://127.0.0.1:{port}/discovery/inventory?server=x&token=y"
    ))
    .unwrap();
    let out = post(&url, br#"{"a":1}"#, Duration::from_secs(5), |_| {});
    assert_eq!(out, Outcome::Accepted(202));
    let req = rx.recv().unwrap();
    assert!(
        req.starts_with("POST /discovery/inventory?server=x&token=y HTTP/1.1\r\n"),
        "{req}"
    );
    assert!(
        req.contains(&format!("\r\nHost: 127.0.0.1:{port}\r\n")),
        "{req}"
    );
    assert!(
        req.contains("\r\nContent-Type: application/json\r\n"),
        "{req}"
    );
    assert!(req.contains("\r\nContent-Length: 7\r\n"), "{req}");
    assert!(req.ends_with("\r\n\r\n{\"a\":1}"), "{req}");
    assert!(!req.to_ascii_lowercase().contains("chunked"));
}

#[test]
fn a_4xx_stops_without_retrying() {
    let (port, rx) = server(vec![
        "HTTP/1.1 403 Forbidden\r\nContent-Length: 24\r\n\r\nidentity check: bad token",
        "HTTP/1.1 202 Accepted\r\n\r\n",
    ]);
    let url = parse_url(&format!("http://127.0.0.1:{port}/i")).unwrap();
    let t = Instant::now();
    let out = post(&url, b"{}", Duration::from_secs(30), |_| {});
    assert_eq!(
        out,
        Outcome::Refused(403, "identity check: bad token".into())
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    rx.recv().unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(1500)).is_err(),
        "no second attempt"
    );
}

#[test]
fn a_503_is_retried_until_accepted() {
    let (port, rx) = server(vec![
        "HTTP/1.1 503 Service Unavailable\r\n\r\n",
        "HTTP/1.1 503 Service Unavailable\r\n\r\n",
        "HTTP/1.0 200 OK\r\n\r\n",
    ]);
    let url = parse_url(&format!("http://127.0.0.1:{port}/i")).unwrap();
    let mut logged = Vec::new();
    let out = post(&url, b"{}", Duration::from_secs(30), |m| {
        logged.push(m.to_string())
    });
    assert_eq!(out, Outcome::Accepted(200));
    assert_eq!(rx.iter().take(3).count(), 3);
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert!(
        logged[0].starts_with("server answered 503; retrying in"),
        "{logged:?}"
    );
}

#[test]
fn connection_refused_gives_up_at_the_deadline() {
    // A port nobody listens on: bind, read the port, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = parse_url(&format!("http://127.0.0.1:{port}/i")).unwrap();
    let t = Instant::now();
    let out = post(&url, b"{}", Duration::from_secs(2), |_| {});
    assert!(
        matches!(&out, Outcome::GaveUp(e) if e.contains("connecting to")),
        "{out:?}"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[test]
fn urls() {
    let u = parse_url("http://10.0.2.2:8080/discovery/inventory?server=x&token=y").unwrap();
    assert_eq!(
        (u.host.as_str(), u.port, u.path.as_str()),
        ("10.0.2.2", 8080, "/discovery/inventory?server=x&token=y")
    );
    let u = parse_url("http://boot.example").unwrap();
    assert_eq!(
        (u.host.as_str(), u.port, u.path.as_str()),
        ("boot.example", 80, "/")
    );
    let u = parse_url("http://h?x=1#frag").unwrap();
    assert_eq!(u.path, "/?x=1");
    let u = parse_url("http://[fd00::1]:81/p").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("[fd00::1]", 81));
    for bad in [
        "https://h/",
        "ftp://h",
        "http://",
        "http://h:99999/",
        "http://u:p@h/",
        "http://[fd00::1/",
        "http://h/a b",
    ] {
        assert!(parse_url(bad).is_err(), "{bad}");
    }
}

#[test]
fn status_lines_and_backoff() {
    assert_eq!(status_code(b"HTTP/1.1 204 No Content\r\n"), Some(204));
    assert_eq!(status_code(b"HTTP/1.0 404\r\n"), Some(404));
    assert_eq!(status_code(b"HTTP/2 200\r\n"), None);
    assert_eq!(status_code(b"HTTP/1.1 2000 x\r\n"), None);
    assert_eq!(status_code(b"garbage"), None);
    for n in 0..20 {
        let b = backoff(n, 12345);
        let base = Duration::from_millis((1000u64 << n.min(5)).min(30_000));
        assert!(b >= base && b <= base * 3 / 2, "{n}: {b:?}");
    }
}
