//! Unit tests of the client config: resolution order, bad files, private saves.

use super::*;

const SAMPLE: &str = r#"
apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: lab
  cluster: {server: "https://10.0.0.1:9090", certificate-authority: /etc/bp/ca.crt}
- name: edge
  cluster: {server: "https://edge:9090", certificate-authority-data: "LS0tLS1CRUdJTg=="}
users:
- name: alice
  user: {token: "bp1.alice.secret"}
- name: bob
  user: {client-certificate: /b.crt, client-key: /b.key}
contexts:
- name: lab
  context: {cluster: lab, user: alice}
- name: edge-bob
  context: {cluster: edge, user: bob}
"#;

fn flags() -> Flags {
    Flags {
        state_dir: PathBuf::from("/nonexistent-state"),
        ..Default::default()
    }
}

#[test]
fn current_context_gives_server_ca_and_token() {
    let c = ClientConfig::parse(SAMPLE, "t").unwrap();
    let ep = resolve_with(&c, &flags()).unwrap();
    assert_eq!(ep.server, "https://10.0.0.1:9090");
    assert_eq!(ep.ca, Some(Pem::File("/etc/bp/ca.crt".into())));
    assert_eq!(ep.token, Some(Token::Value("bp1.alice.secret".into())));
    assert_eq!(ep.client_cert, None);
}

#[test]
fn context_flag_and_field_flags_win() {
    let c = ClientConfig::parse(SAMPLE, "t").unwrap();
    let f = Flags {
        context: Some("edge-bob".into()),
        ..flags()
    };
    let ep = resolve_with(&c, &f).unwrap();
    assert_eq!(ep.server, "https://edge:9090");
    assert_eq!(ep.ca, Some(Pem::Data(b"-----BEGIN".to_vec())));
    assert_eq!(ep.client_cert, Some(Pem::File("/b.crt".into())));
    assert_eq!(ep.token, None);
    let f = Flags {
        server: Some("https://other:1".into()),
        token: Some("tok".into()),
        ca_file: Some("/x.crt".into()),
        ..flags()
    };
    let ep = resolve_with(&c, &f).unwrap();
    assert_eq!(ep.server, "https://other:1");
    assert_eq!(ep.ca, Some(Pem::File("/x.crt".into())));
    assert_eq!(ep.token, Some(Token::Value("tok".into())));
}

#[test]
fn no_context_means_the_local_appliance() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("tls")).unwrap();
    std::fs::write(d.path().join("tls/ca.crt"), "x").unwrap();
    std::fs::write(d.path().join("api-token"), "t\n").unwrap();
    let f = Flags {
        state_dir: d.path().into(),
        ..Default::default()
    };
    let ep = resolve_with(&ClientConfig::empty(), &f).unwrap();
    assert_eq!(ep.server, DEFAULT_SERVER);
    assert_eq!(ep.ca, Some(Pem::File(d.path().join("tls/ca.crt"))));
    assert_eq!(ep.token.unwrap().read().unwrap(), "t");
    // Nothing at all: a clear error, not a request without credentials.
    let e = resolve_with(&ClientConfig::empty(), &flags()).unwrap_err();
    assert!(e.to_string().contains("no credentials"), "{e}");
}

#[test]
fn bad_configs_are_named() {
    for (text, want) in [
        (
            "clusters: [{name: a, cluster: {server: x}}]",
            "must start with https://",
        ),
        (
            "contexts: [{name: c, context: {cluster: nope, user: u}}]",
            "names cluster \"nope\"",
        ),
        ("current-context: gone", "current-context \"gone\""),
        (
            "users: [{name: u, user: {tokn: x}}]",
            "unknown field `tokn`",
        ),
        (
            "users: [{name: u, user: {}}, {name: u, user: {}}]",
            "user \"u\" is defined twice",
        ),
        ("kind: Pod", "kind Config"),
    ] {
        let e = format!("{:#}", ClientConfig::parse(text, "cfg.yaml").unwrap_err());
        assert!(e.contains(want), "{text}: {e}");
        assert!(e.contains("cfg.yaml"), "{e}");
    }
    let c = ClientConfig::parse(SAMPLE, "t").unwrap();
    let f = Flags {
        context: Some("nope".into()),
        ..flags()
    };
    let e = resolve_with(&c, &f).unwrap_err().to_string();
    assert!(e.contains("known: lab, edge-bob"), "{e}");
}

#[test]
fn a_certificate_needs_its_key() {
    let c = ClientConfig::parse(SAMPLE, "t").unwrap();
    let f = Flags {
        cert_file: Some("/c.crt".into()),
        context: Some("lab".into()),
        ..flags()
    };
    let e = resolve_with(&c, &f).unwrap_err().to_string();
    assert!(e.contains("needs its key"), "{e}");
}

#[test]
fn saved_files_are_private_round_trip_and_view_redacts() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("sub/config");
    let c = ClientConfig::parse(SAMPLE, "t").unwrap();
    c.save(&p).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dmode = std::fs::metadata(p.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dmode, 0o700);
    assert_eq!(ClientConfig::load(&p, true).unwrap(), c);
    let shown = serde_norway::to_string(&c.redacted()).unwrap();
    assert!(!shown.contains("bp1.alice.secret"), "{shown}");
    assert!(shown.contains("REDACTED"), "{shown}");
    // Missing: empty unless it was named explicitly.
    let missing = d.path().join("none");
    assert_eq!(
        ClientConfig::load(&missing, false).unwrap(),
        ClientConfig::empty()
    );
    let e = format!("{:#}", ClientConfig::load(&missing, true).unwrap_err());
    assert!(e.contains("none"), "{e}");
}
