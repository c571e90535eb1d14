//! The sealing's unit tests: envelopes, bindings, key files.

use super::*;

fn ring(names: &[&str]) -> Keyring {
    let mut text = String::new();
    for n in names {
        // The same name gives the same key bytes.
        let secret =
            base64::engine::general_purpose::STANDARD.encode([n.len() as u8 + n.as_bytes()[1]; 32]);
        text.push_str(&format!(
            "[[keys]]\nname = \"{n}\"\nsecret = \"{secret}\"\n"
        ));
    }
    Keyring::parse(&text).unwrap()
}

const KEY: &str = "/core/secrets/default/s";
const PLAIN: &[u8] = br#"{"kind":"Secret","stringData":{"password":"hunter2"}}"#;

#[test]
fn round_trip_names_the_key_and_hides_the_text() {
    let r = ring(&["k1"]);
    let sealed = r.seal(KEY, None, PLAIN);
    assert!(sealed.starts_with(b"bootplane:enc:xchacha20poly1305:v1:k1:"));
    assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
    let (plain, name, legacy) = r
        .open(KEY, Format::V1, &sealed[MAGIC.len()..], None)
        .unwrap();
    assert!(legacy, "v1 is a legacy envelope");
    assert_eq!((plain.as_slice(), &*name), (PLAIN, "k1"));
    // Two seals of the same text differ (a fresh nonce each).
    assert_ne!(sealed, r.seal(KEY, None, PLAIN));
}

#[test]
fn older_keys_still_open_and_the_first_seals() {
    let old = ring(&["k1"]);
    let sealed = old.seal(KEY, None, PLAIN);
    let both = ring(&["k2", "k1"]);
    assert_eq!(
        &*both
            .open(KEY, Format::V1, &sealed[MAGIC.len()..], None)
            .unwrap()
            .1,
        "k1"
    );
    let resealed = both.seal(KEY, None, PLAIN);
    assert!(resealed.starts_with(b"bootplane:enc:xchacha20poly1305:v1:k2:"));
}

#[test]
fn wrong_key_tampering_unknown_key_and_another_object_are_errors() {
    let r = ring(&["k1"]);
    let sealed = r.seal(KEY, None, PLAIN);
    let body = &sealed[MAGIC.len()..];
    // A key of the same name but other bytes.
    let other = Keyring::parse(&format!(
        "[[keys]]\nname = \"k1\"\nsecret = \"{}\"\n",
        base64::engine::general_purpose::STANDARD.encode([9u8; 32])
    ))
    .unwrap();
    let e = other.open(KEY, Format::V1, body, None).unwrap_err();
    assert!(
        matches!(e, SealError::Decrypt { ref name, .. } if name == "k1"),
        "{e}"
    );
    let mut tampered = body.to_vec();
    let last = tampered.len() - 20;
    tampered[last] ^= 1;
    assert!(matches!(
        r.open(KEY, Format::V1, &tampered, None).unwrap_err(),
        SealError::Decrypt { .. }
    ));
    let e = ring(&["k7"]).open(KEY, Format::V1, body, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/core/secrets/default/s is encrypted with key \"k1\", which the key file does not have"
    );
    // Bound to its object: the same bytes under another key do not open.
    assert!(matches!(
        r.open("/core/secrets/default/t", Format::V1, body, None)
            .unwrap_err(),
        SealError::Decrypt { .. }
    ));
    assert!(matches!(
        r.open(KEY, Format::V1, b"k1:short", None).unwrap_err(),
        SealError::Malformed { .. }
    ));
}

#[test]
fn v2_is_bound_to_the_etcd_version_so_an_older_value_put_back_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = Sealer::load(&d.path().join("secrets.key")).unwrap();
    let at = |create_rev, version| Binding {
        create_rev,
        version,
    };
    // Created (version 1, create revision not known yet), then updated twice.
    let (v1, _) = s.seal(KEY, Some(&Binding::CREATE), PLAIN);
    assert!(v1.starts_with(b"bootplane:enc:xchacha20poly1305:v2:"));
    let (v2, _) = s.seal(KEY, Some(&at(40, 2)), b"{\"n\":2}");
    let (v3, _) = s.seal(KEY, Some(&at(40, 3)), b"{\"n\":3}");
    let open = |b: &[u8], held| s.open(KEY, b, Some(&held)).map(|o| o.text.to_vec());
    assert_eq!(open(&v1, at(40, 1)).unwrap(), PLAIN);
    // Bound to no create revision (appliances of before): legacy; bound: not.
    assert!(s.open(KEY, &v1, Some(&at(40, 1))).unwrap().legacy);
    assert!(!s.open(KEY, &v2, Some(&at(40, 2))).unwrap().legacy);
    // A create bound to its real create revision: a re-created key (a new create
    // revision, version 1 again) does not take it back.
    let (made, _) = s.seal(KEY, Some(&at(40, 1)), PLAIN);
    assert_eq!(open(&made, at(40, 1)).unwrap(), PLAIN);
    assert!(!s.open(KEY, &made, Some(&at(40, 1))).unwrap().legacy);
    assert!(matches!(
        open(&made, at(90, 1)).unwrap_err(),
        SealError::Replayed { .. }
    ));
    assert_eq!(open(&v3, at(40, 3)).unwrap(), b"{\"n\":3}");
    assert!(!s.open(KEY, &v3, Some(&at(40, 3))).unwrap().legacy);
    // An older value put back: etcd's version moved on (every put bumps it).
    let e = open(&v2, at(40, 4)).unwrap_err();
    assert_eq!(
        e,
        SealError::Replayed {
            key: KEY.into(),
            sealed: 2,
            held: 4
        }
    );
    assert!(
        e.to_string().contains(KEY) && e.to_string().contains("put back"),
        "{e}"
    );
    assert!(open(&v1, at(40, 5)).is_err());
    // Deleted and re-created with puts up to the old version: a new create revision.
    assert!(matches!(
        open(&v2, at(77, 2)).unwrap_err(),
        SealError::Replayed { .. }
    ));
    // Another object's key, or the binding in the header edited to match: no.
    assert!(matches!(
        s.open("/core/secrets/default/t", &v3, Some(&at(40, 3)))
            .err(),
        Some(SealError::Decrypt { .. })
    ));
    let mut forged = v2.clone();
    let at_binding = MAGIC_V2.len() + s.primary().len() + 1;
    forged[at_binding + 15] = 4;
    assert!(matches!(
        open(&forged, at(40, 4)).unwrap_err(),
        SealError::Decrypt { .. }
    ));
    // The embedded engine (no versions) opens v2 with its own binding, and v1 as
    // before; a v1 value on etcd opens and says so (the reseal pass rewrites it).
    assert!(!s.open(KEY, &v2, None).unwrap().legacy);
    let (old, _) = s.seal(KEY, None, PLAIN);
    let o = s.open(KEY, &old, Some(&at(40, 9))).unwrap();
    assert_eq!((&*o.text, o.legacy), (PLAIN, true));
    // v2's associated data is not v1's: a v2 body relabelled v1 does not open.
    let mut relabelled = MAGIC.to_vec();
    relabelled.extend_from_slice(&v3[MAGIC_V2.len()..]);
    assert!(s.open(KEY, &relabelled, None).is_err());
    assert!(
        is_sealed("/auth.bootplane.dev/apitokens/t")
            && must_be_sealed("/auth.bootplane.dev/apitokens/t")
    );
    assert!(!must_be_sealed(KEY));
}

#[test]
fn key_files_are_checked_without_showing_secrets() {
    let bad = |text: &str, says: &str| {
        let e = format!("{:#}", Keyring::parse(text).unwrap_err());
        assert!(e.contains(says), "{e}");
        assert!(!e.contains("c2VjcmV0"), "{e}");
    };
    bad("", "no [[keys]]");
    bad("keys = []", "no [[keys]]");
    bad(
        "[[keys]]\nname = \"a\"\nsecret = \"c2VjcmV0\"\n",
        "not 32 bytes",
    );
    bad(
        "[[keys]]\nname = \"a b\"\nsecret = \"c2VjcmV0\"\n",
        "names are",
    );
    bad(
        "[[keys]]\nname = \"identity\"\nsecret = \"c2VjcmV0\"\n",
        "names are",
    );
    bad(
        "[[keys]]\nnom = \"a\"\nsecret = \"c2VjcmV0\"\n",
        "not a key file",
    );
    let k = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
    bad(
        &format!(
            "[[keys]]\nname = \"a\"\nsecret = \"{k}\"\n[[keys]]\nname = \"a\"\nsecret = \"{k}\"\n"
        ),
        "twice",
    );
    assert!(!format!("{:?}", ring(&["k1"])).contains(&k));
}

#[test]
fn the_file_is_created_private_refused_when_readable_and_reloaded() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("secrets.key");
    let s = Sealer::load(&path).unwrap();
    let md = std::fs::metadata(&path).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert_eq!(s.key_names().len(), 1);
    let first = s.primary();
    let (sealed, name) = s.seal(KEY, None, PLAIN);
    assert_eq!(name, first);
    let file = std::fs::read_to_string(&path).unwrap();
    let secret = file
        .lines()
        .find_map(|l| l.strip_prefix("secret = "))
        .unwrap();
    assert!(!format!("{s:?}").contains(secret.trim_matches('"')));
    // Loading again reads the same key.
    assert_eq!(
        &*Sealer::load(&path)
            .unwrap()
            .open(KEY, &sealed, None)
            .unwrap()
            .text,
        PLAIN
    );
    // A new key first: reloaded, seals with it, still opens the old.
    let text = std::fs::read_to_string(&path).unwrap();
    let new = format!(
        "[[keys]]\nname = \"key2\"\nsecret = \"{}\"\n{text}",
        base64::engine::general_purpose::STANDARD.encode([5u8; 32])
    );
    std::fs::write(&path, new).unwrap();
    assert!(s.reload(false).unwrap());
    assert!(!s.reload(false).unwrap(), "unchanged: not read again");
    assert_eq!(&*s.primary(), "key2");
    assert_eq!(
        s.open(KEY, &sealed, None).unwrap().key.as_deref(),
        Some(&*first)
    );
    // Readable by others: refused, naming the file; the keys stay.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = format!("{:#}", Sealer::load(&path).unwrap_err());
    assert!(e.contains("secrets.key") && e.contains("0644"), "{e}");
    assert!(s.reload(true).is_err());
    assert_eq!(&*s.primary(), "key2");
    // A value in clear passes through, with no key.
    assert!(s.open(KEY, PLAIN, None).unwrap().key.is_none());
}
