//! Unit tests of [`super`]: rendering templates into Ignition configs.

use super::*;

fn facts() -> MachineFacts {
    MachineFacts {
        name: "server-a".into(),
        uuid: Some("38947555-7742-3448-3784-823347823834".into()),
        macs: vec!["52:54:00:12:34:56".into()],
        ips: vec!["10.199.0.10".into()],
        labels: [("rack".to_string(), "r1".to_string())].into(),
        claim_name: Some("claim-a".into()),
        claim_namespace: Some("default".into()),
        ..Default::default()
    }
}

const TPL: &str = "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\"\n    - path: /etc/bootplane/facts.json\n      contents:\n        inline: '{{ {\"uuid\": uuid, \"mac\": mac, \"rack\": labels.rack, \"claim\": claim.namespace ~ \"/\" ~ claim.name} | tojson }}'\n";

#[test]
fn template_then_secret_merge() {
    let mut r = Renderer::new();
    r.add_template(Template::new("default.bu", TPL)).unwrap();
    let secret = IgnitionSecret {
            ignition: "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/hostname\n      contents:\n        inline: override\n".into(),
            format: Some("fcos".into()),
        };
    let out = r
        .render(Some("default.bu"), &facts(), Some(&secret))
        .unwrap();
    assert_eq!(out.version, IgnVersion::V3_4);
    let files = out.config["storage"]["files"].as_array().unwrap();
    assert_eq!(files[0]["contents"]["source"], "data:,override");
    assert_eq!(files[0]["mode"], 0o644);
    let facts_json =
        String::from_utf8(validate::inline_contents(&files[1]["contents"]).unwrap()).unwrap();
    assert_eq!(
        facts_json,
        r#"{"claim":"default/claim-a","mac":"52:54:00:12:34:56","rack":"r1","uuid":"38947555-7742-3448-3784-823347823834"}"#
    );
    let only = r.render(Some("default.bu"), &facts(), None).unwrap();
    assert_eq!(
        only.config["storage"]["files"][0]["contents"]["source"],
        "data:,server-a"
    );
}

#[test]
fn shipped_default_template_renders_with_and_without_labels() {
    let mut r = Renderer::new();
    r.add_template(Template::new(
        "default.bu",
        include_str!("../../../../../ignition/default.bu"),
    ))
    .unwrap();
    let out = r.render(Some("default.bu"), &facts(), None).unwrap();
    let env = validate::inline_contents(&out.config["storage"]["files"][1]["contents"]).unwrap();
    assert_eq!(
        String::from_utf8(env).unwrap(),
        "BOOTPLANE_SERVER=server-a\nBOOTPLANE_UUID=38947555-7742-3448-3784-823347823834\n\
             BOOTPLANE_MAC=52:54:00:12:34:56\nBOOTPLANE_IP=10.199.0.10\n\
             BOOTPLANE_CLAIM=default/claim-a\nBOOTPLANE_RACK=r1\n"
    );
    let mut f = facts();
    f.labels.clear();
    f.uuid = None;
    let out = r.render(Some("default.bu"), &f, None).unwrap();
    assert_eq!(
        out.config["storage"]["files"][0]["contents"]["source"],
        "data:,server-a%0A"
    );
}

/// The structural fast path ([`Plan`]) gives exactly what the text path gives, for
/// templates and facts on both sides of its conditions; templates outside them have
/// no plan.
#[test]
fn plan_matches_text_rendering() {
    let head = "variant: fcos\nversion: 1.4.0\n";
    let eligible = [
            "storage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\\n\"\n    - path: /etc/a\n      mode: 420\n      contents:\n        inline: |\n          N={{name}} U={{ uuid }}\n          M={{ mac }}/{{ ip }} {{ claim.namespace }}/{{ claim.name }} {{ labels.rack }}\n    - path: /etc/b\n      contents:\n        inline: 'x {{ name }}'\n    - path: /etc/c\n      contents:\n        inline: >\n          folded {{ name }}\n          text {{ mac }}\n",
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: \"a\n          {{ name }}  b\"\n",
            // a bad mode: every machine falls back to the text path for its error
            "storage:\n  files:\n    - path: /etc/x\n      mode: 0999\n      contents:\n        inline: \"{{ name }}\"\n",
            "passwd:\n  users:\n    - name: core\n      gecos: \"{{ name }}\"\n",
        ];
    let ineligible = [
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: {{ name }}\n",
            "# {{ name }}\nstorage: {}\n",
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: \"{{ name | upper }}\"\n",
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: \"{{- name }}\"\n",
            "{% if true %}storage: {}{% endif %}\n",
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: |\n{{ name }}\n",
            "storage:\n  files:\n    - path: /etc/x\n      contents:\n        inline: !!str \"{{ name }}\"\n",
            "storage:\n  files:\n    - path: \"/etc/{{ name }}\"\n      contents:\n        inline: \"{{ macs }}\"\n",
        ];
    let mut all = vec![facts()];
    for bad in [
        "a b", "a\"b", "a'b", "a\\b", "a\nb", "", "x: y", "-", "ünï", " lead", "#c",
    ] {
        let mut f = facts();
        f.name = bad.into();
        all.push(f);
    }
    let mut f = facts();
    f.labels.clear();
    all.push(f);
    let mut f = facts();
    f.uuid = None;
    all.push(f);
    let mut f = facts();
    f.hostname = Some("host-1.example.org".into());
    all.push(f);
    for (i, body) in eligible.iter().chain(ineligible.iter()).enumerate() {
        let mut r = Renderer::new();
        let src = format!("{head}{body}");
        r.add_template(Template::new("t.bu", src.as_str())).unwrap();
        assert_eq!(
            r.plans.contains_key("t.bu"),
            i < eligible.len(),
            "plan for template {i}: {src}"
        );
        let t = r.template("t.bu").unwrap().clone();
        for f in &all {
            let fast = r.render_template("t.bu", f);
            let text = r.render_text(&t, f);
            match (fast, text) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "template {i}, facts {f:?}"),
                (Err(a), Err(b)) => {
                    assert_eq!(a.to_string(), b.to_string(), "template {i}, facts {f:?}")
                }
                (a, b) => panic!("template {i}, facts {f:?}: {a:?} vs {b:?}"),
            }
        }
    }
    // And the plan is used: a safe machine never reaches the text path.
    let mut r = Renderer::new();
    r.add_template(Template::new("t.bu", format!("{head}{}", eligible[0])))
        .unwrap();
    assert!(r.plans["t.bu"].translate(&facts(), r.files()).is_some());
    let bench = "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\\n\"\n    - path: /etc/bootplane/machine.env\n      mode: 0600\n      contents:\n        inline: |\n          NAME={{ name }}\n          UUID={{ uuid }}\n          MAC={{ mac }}\n          IP={{ ip }}\n          CLAIM={{ claim.namespace }}/{{ claim.name }}\n    - path: /etc/app/conf.d/00-part.conf\n      mode: 0644\n      contents:\n        inline: |\n          key0 = value-0-for-{{ name }}\n";
    r.add_template(Template::new("b.bu", bench)).unwrap();
    assert!(r.plans.contains_key("b.bu"));
    assert!(r.plans["b.bu"].translate(&facts(), r.files()).is_some());
}

#[test]
fn strict_undefined_and_syntax_errors() {
    let mut r = Renderer::new();
    r.add_template(Template::new(
        "t.bu",
        "variant: fcos\nversion: 1.5.0\n# {{ nosuchvar }}\n",
    ))
    .unwrap();
    let e = r.render(Some("t.bu"), &facts(), None).unwrap_err();
    assert!(e.to_string().contains("line 3"), "{e}");
    let e = r
        .add_template(Template::new("u.bu", "a\n{% if %}\n"))
        .unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
}

#[test]
fn secret_formats() {
    let r = Renderer::new();
    let json = IgnitionSecret {
        ignition: r#"{"ignition":{"version":"3.3.0"}}"#.into(),
        format: None,
    };
    assert_eq!(
        r.render(None, &facts(), Some(&json)).unwrap().version,
        IgnVersion::V3_3
    );
    let bad = IgnitionSecret {
        ignition: "x".into(),
        format: Some("yaml".into()),
    };
    assert!(matches!(
        r.render(None, &facts(), Some(&bad)),
        Err(Error::Secret(_))
    ));
    assert!(IgnitionSecret::from_data(&BTreeMap::new()).is_err());
}

#[test]
fn cache_keys_and_invalidation() {
    let c = RenderCache::new();
    let r = Renderer::new();
    let s = IgnitionSecret {
        ignition: r#"{"ignition":{"version":"3.3.0"}}"#.into(),
        format: None,
    };
    let k = RenderKey {
        server: "a".into(),
        secret_revision: "1".into(),
        template_revision: "t".into(),
    };
    let mut calls = 0;
    for _ in 0..3 {
        c.get_or_render(&k, || {
            calls += 1;
            r.render(None, &facts(), Some(&s))
        })
        .unwrap();
    }
    assert_eq!(calls, 1);
    assert!(c.get("a", "2", "t").is_none());
    assert!(c.get("a", "1", "t").is_some());
    c.invalidate("a");
    assert!(c.is_empty());

    // Keyed on the facts too: same facts hit, a changed fact re-renders.
    let mut calls = 0;
    let mut f = facts();
    for change in [false, false, true, false] {
        if change {
            f.labels.insert("rack".into(), "r9".into());
        }
        c.get_or_render_for(&k, &f, || {
            calls += 1;
            r.render(None, &f, Some(&s))
        })
        .unwrap();
    }
    assert_eq!(calls, 2);
}
