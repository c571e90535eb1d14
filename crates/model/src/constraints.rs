//! Constraints the reference CRDs lack: fields that metal-operator's Go API types
//! (`api/v1alpha1/*_types.go`) give fixed values or a format, but whose generated CRD
//! schema (`crds/`, kept unchanged) declares as plain strings. bootplane maintains this
//! table next to the CRDs; the store applies it to every write, after the schema
//! (`store::validate`), so a typo in `status.state` is refused with the field named
//! instead of leaving a server unclaimable.
//!
//! Where each set of values comes from (metal-operator's API types):
//! - `Server.status.state`: `ServerState` ([`ServerState`]).
//! - `Server.status.powerState`, `BMC.status.powerState`: `ServerPowerState`,
//!   `BMCPowerState` ([`ServerPowerState`]).
//! - `Server.spec.power`, `ServerClaim.spec.power`: `Power` ([`PowerState`]): On and Off
//!   are all the controllers act on.
//! - `BMC.status.state`: `BMCState` ([`BmcState`]); the CRD's description carries a
//!   malformed `kubebuilder:validation:Enum` marker, so the generated schema has none.
//! - `ServerClaim.status.phase`: `Phase` ([`ClaimPhase`]).
//! - `ServerBootConfiguration.status.state`: `ServerBootConfigurationState`
//!   ([`BootConfigurationState`]).
//! - `Server.spec.systemUUID`: the SMBIOS UUID the machine reports ([`ident::parse_uuid`]).
//! - MAC addresses (`macAddress` fields): [`ident::parse_mac`]'s grammar.
//! - IP addresses: metal-operator's `IP` type (a `netip.Addr`), and the Server CRD's
//!   `format: ip` on `networkInterfaces[].ips[]`, a format the schema validator leaves
//!   to this table (a test below checks that every `format: ip` field is covered).
//! - `Endpoint` (`spec.macAddress`, `spec.ip`): its rules apply once the type is
//!   registered; until then they match nothing.
//!
//! The allowed values are the enums of [`super::views`] (`VALUES`), the names the
//! controllers read, so the two cannot drift apart.
//!
//! A value unchanged by an update is not checked again (like labels in the store): an
//! object stored before a rule existed keeps taking writes that leave that value alone.
//! For list items, "unchanged" means the old object had the same value at the same
//! field of any item, so reordering or adding interfaces does not re-check old ones.

use std::collections::HashSet;
use std::net::IpAddr;

use serde_json::Value;

use super::ident;
use super::schema::{FieldError, Reason};
use super::views::{
    BmcState, BootConfigurationState, ClaimPhase, PowerState, ServerPowerState, ServerState,
};

/// What a field's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// One of these strings, exactly.
    OneOf(&'static [&'static str]),
    /// A UUID ([`ident::parse_uuid`]).
    Uuid,
    /// A MAC address ([`ident::parse_mac`]).
    Mac,
    /// An IPv4 or IPv6 address.
    Ip,
}

/// One rule: a field of a kind (`group`/`kind`) and its check. `field` is a dotted
/// path from the object's root; a segment ending in `[]` is a list whose every item
/// is followed (`status.networkInterfaces[].ips[]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Constraint {
    pub group: &'static str,
    pub kind: &'static str,
    pub field: &'static str,
    pub check: Check,
}

const METAL: &str = "metal.ironcore.dev";

const fn rule(kind: &'static str, field: &'static str, check: Check) -> Constraint {
    Constraint {
        group: METAL,
        kind,
        field,
        check,
    }
}

/// Every constraint bootplane adds to the reference CRDs.
#[rustfmt::skip]
pub(crate) static CONSTRAINTS: &[Constraint] = &[
    rule("Server", "spec.power", Check::OneOf(PowerState::VALUES)),
    rule("Server", "spec.systemUUID", Check::Uuid),
    rule("Server", "status.state", Check::OneOf(ServerState::VALUES)),
    rule("Server", "status.powerState", Check::OneOf(ServerPowerState::VALUES)),
    rule("Server", "status.networkInterfaces[].macAddress", Check::Mac),
    rule("Server", "status.networkInterfaces[].ip", Check::Ip),
    rule("Server", "status.networkInterfaces[].ips[]", Check::Ip),
    rule("BMC", "spec.access.macAddress", Check::Mac),
    rule("BMC", "spec.access.ip", Check::Ip),
    rule("BMC", "status.state", Check::OneOf(BmcState::VALUES)),
    rule("BMC", "status.powerState", Check::OneOf(ServerPowerState::VALUES)),
    rule("BMC", "status.macAddress", Check::Mac),
    rule("BMC", "status.ip", Check::Ip),
    rule("ServerClaim", "spec.power", Check::OneOf(PowerState::VALUES)),
    rule("ServerClaim", "status.phase", Check::OneOf(ClaimPhase::VALUES)),
    rule("ServerBootConfiguration", "status.state", Check::OneOf(BootConfigurationState::VALUES)),
    rule("Endpoint", "spec.macAddress", Check::Mac),
    rule("Endpoint", "spec.ip", Check::Ip),
];

/// The longest part of a refused value quoted in a message.
const SHOWN_CHARS: usize = 64;

/// Check `obj`, of `group`/`kind`, against [`CONSTRAINTS`]; `old` is the stored object
/// on update. Absent and null fields pass (the schema says what is required); so do
/// values that are not strings (the schema reports their type).
pub fn check(
    group: &str,
    kind: &str,
    obj: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
    for c in CONSTRAINTS
        .iter()
        .filter(|c| c.group == group && c.kind == kind)
    {
        let segs: Vec<&str> = c.field.split('.').collect();
        let mut found = Vec::new();
        visit(obj, &segs, String::new(), &mut found);
        if found.is_empty() {
            continue;
        }
        let mut before = Vec::new();
        if let Some(o) = old {
            visit(o, &segs, String::new(), &mut before);
        }
        let before: HashSet<&str> = before.iter().filter_map(|(_, v)| v.as_str()).collect();
        for (path, v) in found {
            let Some(s) = v.as_str() else { continue };
            if before.contains(s) {
                continue;
            }
            if let Some(e) = refuse(c.check, &path, s) {
                errs.push(e);
            }
        }
    }
}

/// The values at `segs` under `v`, with their concrete paths (`a.b[2].c`).
fn visit<'a>(v: &'a Value, segs: &[&str], path: String, out: &mut Vec<(String, &'a Value)>) {
    let Some((seg, rest)) = segs.split_first() else {
        out.push((path, v));
        return;
    };
    let (name, each) = match seg.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (*seg, false),
    };
    let Some(child) = v.get(name).filter(|c| !c.is_null()) else {
        return;
    };
    let p = if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    };
    if !each {
        return visit(child, rest, p, out);
    }
    if let Some(items) = child.as_array() {
        for (i, it) in items.iter().enumerate() {
            visit(it, rest, format!("{p}[{i}]"), out);
        }
    }
}

/// The error for `s` at `path`, or `None` when it passes.
fn refuse(check: Check, path: &str, s: &str) -> Option<FieldError> {
    let (reason, why) = match check {
        Check::OneOf(allowed) => {
            if allowed.contains(&s) {
                return None;
            }
            let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
            let message = format!(
                "Unsupported value: {}: supported values: {}",
                shown(s),
                list.join(", ")
            );
            return Some(FieldError {
                field: path.into(),
                reason: Reason::NotSupported,
                message,
            });
        }
        Check::Uuid if ident::parse_uuid(s).is_ok() => return None,
        Check::Uuid => (
            Reason::Invalid,
            "must be a UUID (32 hex digits, hyphenated 8-4-4-4-12 or not)",
        ),
        Check::Mac if ident::parse_mac(s).is_ok() => return None,
        Check::Mac => (
            Reason::Invalid,
            "must be a MAC address (aa:bb:cc:dd:ee:ff, aa-bb-cc-dd-ee-ff or aabbccddeeff)",
        ),
        Check::Ip if s.parse::<IpAddr>().is_ok() => return None,
        Check::Ip => (Reason::Invalid, "must be an IPv4 or IPv6 address"),
    };
    Some(FieldError {
        field: path.into(),
        reason,
        message: format!("Invalid value: {}: {why}", shown(s)),
    })
}

/// `s` quoted as JSON, cut at [`SHOWN_CHARS`] characters.
fn shown(s: &str) -> String {
    if s.chars().count() <= SHOWN_CHARS {
        return Value::from(s).to_string();
    }
    let cut: String = s.chars().take(SHOWN_CHARS).collect();
    format!("{}...", Value::from(cut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use crate::schema::Schema;
    use serde_json::json;

    fn errs(kind: &str, obj: Value, old: Option<Value>) -> Vec<FieldError> {
        let mut e = Vec::new();
        check(METAL, kind, &obj, old.as_ref(), &mut e);
        e
    }

    fn fields(e: &[FieldError]) -> Vec<&str> {
        e.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn values_are_metal_operators() {
        assert_eq!(
            ServerState::VALUES,
            [
                "Initial",
                "Discovery",
                "Available",
                "Reserved",
                "Released",
                "Error",
                "Maintenance",
                "Cleanup"
            ]
        );
        assert_eq!(
            ServerPowerState::VALUES,
            ["On", "Off", "Paused", "PoweringOn", "PoweringOff"]
        );
        assert_eq!(BmcState::VALUES, ["Enabled", "Error", "Pending"]);
        assert_eq!(ClaimPhase::VALUES, ["Bound", "Unbound"]);
        assert_eq!(
            BootConfigurationState::VALUES,
            ["Pending", "Ready", "Error"]
        );
        assert_eq!(PowerState::VALUES, ["On", "Off"]);
    }

    /// The schema of `field` (a table path) in `s`, if the CRD has that field.
    fn schema_at<'a>(s: &'a Schema, field: &str) -> Option<&'a Schema> {
        let mut s = s;
        for seg in field.split('.') {
            let (name, each) = match seg.strip_suffix("[]") {
                Some(n) => (n, true),
                None => (seg, false),
            };
            s = s.properties.get(name)?;
            if each {
                s = s.items.as_deref()?;
            }
        }
        Some(s)
    }

    /// A typo in the table would silently check nothing: every field is a string
    /// field of its kind's CRD (Endpoint's once its CRD is registered).
    #[test]
    fn every_rule_names_a_string_field_of_its_crd() {
        let reg = Registry::global();
        for c in CONSTRAINTS {
            let Some(t) = reg.by_kind(&format!("{}/v1alpha1", c.group), c.kind) else {
                assert_eq!(c.kind, "Endpoint", "{c:?}: no such kind");
                continue;
            };
            let s = t.schema.as_ref().expect("schema");
            let f = schema_at(s, c.field).unwrap_or_else(|| panic!("{c:?}: no such field"));
            assert_eq!(f.ty.as_deref(), Some("string"), "{c:?}");
        }
    }

    /// `format: ip` is left to this table by the schema validator: every field with
    /// it in an embedded CRD has an IP rule here.
    #[test]
    fn every_ip_format_in_the_crds_is_covered() {
        fn walk(s: &Schema, path: String, out: &mut Vec<String>) {
            if s.format.as_deref() == Some("ip") {
                out.push(path.clone());
            }
            for (k, c) in &s.properties {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(c, p, out);
            }
            if let Some(i) = &s.items {
                walk(i, format!("{path}[]"), out);
            }
        }
        for t in &Registry::global().types {
            let mut ips = Vec::new();
            if let Some(s) = &t.schema {
                walk(s, String::new(), &mut ips);
            }
            for f in ips {
                assert!(
                    CONSTRAINTS.iter().any(|c| c.group == t.group
                        && c.kind == t.kind
                        && c.field == f
                        && c.check == Check::Ip),
                    "{} {f} has format ip and no rule",
                    t.kind
                );
            }
        }
    }

    #[test]
    fn refuses_typos_naming_the_field() {
        let e = errs("Server", json!({"status": {"state": "Availble"}}), None);
        assert_eq!(fields(&e), ["status.state"]);
        assert_eq!(e[0].reason, Reason::NotSupported);
        assert_eq!(
            e[0].message,
            "Unsupported value: \"Availble\": supported values: \"Initial\", \"Discovery\", \"Available\", \"Reserved\", \"Released\", \"Error\", \"Maintenance\", \"Cleanup\""
        );
        let e = errs(
            "Server",
            json!({"spec": {"systemUUID": "u1", "power": "Sideways"},
                   "status": {"powerState": "on", "networkInterfaces": [
                       {"name": "eth0", "macAddress": "52:54:00:00:00:01", "ips": ["10.0.0.1", "fd00::1"]},
                       {"name": "eth1", "macAddress": "52:54:00:00:00:0g", "ip": "10.0.0.300",
                        "ips": ["10.0.0.2", "fd00::zz"]}]}}),
            None,
        );
        assert_eq!(
            fields(&e),
            [
                "spec.power",
                "spec.systemUUID",
                "status.powerState",
                "status.networkInterfaces[1].macAddress",
                "status.networkInterfaces[1].ip",
                "status.networkInterfaces[1].ips[1]",
            ]
        );
        assert!(
            e[1].message
                .starts_with("Invalid value: \"u1\": must be a UUID"),
            "{e:?}"
        );
        assert!(e[3].message.contains("must be a MAC address"), "{e:?}");
        assert!(
            e[4].message.contains("must be an IPv4 or IPv6 address"),
            "{e:?}"
        );
        let e = errs(
            "BMC",
            json!({"spec": {"access": {"ip": "bmc.example", "macAddress": "x"}},
                   "status": {"state": "enabled", "powerState": "Unknown", "macAddress": "", "ip": "1.2.3"}}),
            None,
        );
        assert_eq!(
            fields(&e),
            [
                "spec.access.macAddress",
                "spec.access.ip",
                "status.state",
                "status.powerState",
                "status.macAddress",
                "status.ip",
            ]
        );
        let e = errs("ServerClaim", json!({"status": {"phase": "bound"}}), None);
        assert_eq!(fields(&e), ["status.phase"]);
        let e = errs(
            "ServerBootConfiguration",
            json!({"status": {"state": "Done"}}),
            None,
        );
        assert_eq!(fields(&e), ["status.state"]);
        let e = errs(
            "Endpoint",
            json!({"spec": {"macAddress": "m", "ip": "i"}}),
            None,
        );
        assert_eq!(fields(&e), ["spec.macAddress", "spec.ip"]);
        // Another group's kind of the same name is not metal-operator's.
        let mut other = Vec::new();
        check(
            "example.com",
            "Server",
            &json!({"status": {"state": "x"}}),
            None,
            &mut other,
        );
        assert!(other.is_empty());
        // A long value is shown cut.
        let e = errs(
            "Server",
            json!({"status": {"state": "x".repeat(1000)}}),
            None,
        );
        assert!(e[0].message.len() < 300, "{}", e[0].message);
    }

    #[test]
    fn accepts_every_known_value_and_form() {
        for st in ServerState::VALUES {
            for p in ServerPowerState::VALUES {
                let e = errs(
                    "Server",
                    json!({"status": {"state": st, "powerState": p}}),
                    None,
                );
                assert!(e.is_empty(), "{e:?}");
            }
        }
        let e = errs(
            "Server",
            json!({"spec": {"systemUUID": "4C4C4544-0042-3510-8052-B4C04F4E4D32", "power": null},
                   "status": {"state": null, "networkInterfaces": [
                       {"name": "a", "macAddress": "52-54-00-AB-CD-EF", "ip": "::1", "ips": []},
                       {"name": "b", "macAddress": "525400abcdef"},
                       {"name": "c", "macAddress": 7}]}}),
            None,
        );
        assert!(
            e.is_empty(),
            "absent, null and non-string values pass: {e:?}"
        );
        assert!(errs(
            "Server",
            json!({"spec": {"systemUUID": "4c4c4544004235108052b4c04f4e4d32"}}),
            None
        )
        .is_empty());
    }

    #[test]
    fn unchanged_values_are_not_checked_again() {
        let old = json!({"spec": {"systemUUID": "u1"},
            "status": {"state": "Parked", "networkInterfaces": [{"name": "a", "macAddress": "bogus"}]}});
        // Other fields change: the old values stand.
        let mut new = old.clone();
        new["status"]["conditions"] = json!([]);
        assert!(errs("Server", new.clone(), Some(old.clone())).is_empty());
        // An interface added in front: the old one moved, still not checked; the new one is.
        new["status"]["networkInterfaces"] = json!([
            {"name": "z", "macAddress": "zz"}, {"name": "a", "macAddress": "bogus"}]);
        assert_eq!(
            fields(&errs("Server", new.clone(), Some(old.clone()))),
            ["status.networkInterfaces[0].macAddress"]
        );
        // A changed value is checked, even from a bad one.
        new["status"]["networkInterfaces"] = json!([]);
        new["status"]["state"] = json!("Parkd");
        assert_eq!(fields(&errs("Server", new, Some(old))), ["status.state"]);
    }
}
