//! Redfish JSON (already parsed into `serde_json::Value`) to the typed objects in
//! `types`: tolerant of missing properties (they become `None`/empty), strict only
//! where the client cannot go on (`@odata.id` of what it was asked to read).

use serde_json::Value;

use super::types::*;

/// The object's own `@odata.id`, else (absent or empty) the path it was read from.
fn self_link(v: &Value, read_from: &str) -> String {
    str_at(v, "@odata.id")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| read_from.to_owned())
}

fn str_at(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A descriptive string (manufacturer, model, serial, versions) as status and the CLI
/// show it: control characters dropped (a BMC's escape sequence must not reach the
/// operator's terminal), at most 256 characters.
fn text_at(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(|s| s.chars().filter(|c| !c.is_control()).take(256).collect())
}

fn strings_at(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `{"@odata.id": "..."}` under `key`.
fn link_at(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(|l| str_at(l, "@odata.id"))
}

/// The `@odata.id`s of a collection's `Members`.
pub fn members(v: &Value) -> Result<Vec<String>, Error> {
    let members = v
        .get("Members")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::Malformed("collection without Members".into()))?;
    members
        .iter()
        .map(|m| {
            str_at(m, "@odata.id")
                .ok_or_else(|| Error::Malformed("member without @odata.id".into()))
        })
        .collect()
}

pub fn service_root(v: &Value) -> ServiceRoot {
    ServiceRoot {
        redfish_version: text_at(v, "RedfishVersion"),
        uuid: str_at(v, "UUID"),
        vendor: text_at(v, "Vendor"),
        product: text_at(v, "Product"),
        session_service: link_at(v, "SessionService"),
    }
}

/// `Links.Sessions` of the service root, the sessions collection's usual place.
pub fn sessions_link(v: &Value) -> Option<String> {
    v.get("Links").and_then(|l| link_at(l, "Sessions"))
}

/// `odata_id` is the path the object was read from (used when the body lacks one).
pub fn system(v: &Value, odata_id: &str, etag: Option<String>) -> System {
    let boot = v.get("Boot").cloned().unwrap_or(Value::Null);
    let reset = v
        .get("Actions")
        .and_then(|a| a.get("#ComputerSystem.Reset"));
    System {
        odata_id: self_link(v, odata_id),
        id: str_at(v, "Id").unwrap_or_default(),
        uuid: str_at(v, "UUID"),
        manufacturer: text_at(v, "Manufacturer"),
        model: text_at(v, "Model"),
        serial_number: text_at(v, "SerialNumber"),
        bios_version: text_at(v, "BiosVersion"),
        power_state: v
            .get("PowerState")
            .and_then(Value::as_str)
            .and_then(PowerState::parse),
        boot: Boot {
            target: str_at(&boot, "BootSourceOverrideTarget"),
            enabled: str_at(&boot, "BootSourceOverrideEnabled"),
            mode: str_at(&boot, "BootSourceOverrideMode"),
            http_boot_uri: str_at(&boot, "HttpBootUri"),
            allowed_targets: strings_at(&boot, "BootSourceOverrideTarget@Redfish.AllowableValues"),
        },
        reset_target: reset.and_then(|r| str_at(r, "target")),
        reset_types: reset
            .map(|r| strings_at(r, "ResetType@Redfish.AllowableValues"))
            .unwrap_or_default(),
        etag: etag.or_else(|| str_at(v, "@odata.etag")),
        managers: v
            .get("Links")
            .and_then(|l| l.get("ManagedBy"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|m| str_at(m, "@odata.id")).collect())
            .unwrap_or_default(),
        virtual_media: link_at(v, "VirtualMedia"),
        ethernet_interfaces: link_at(v, "EthernetInterfaces"),
    }
}

pub(crate) fn ethernet_interface(v: &Value) -> EthernetInterface {
    EthernetInterface {
        id: str_at(v, "Id").unwrap_or_default(),
        mac: str_at(v, "MACAddress")
            .filter(|m| !m.is_empty())
            .or_else(|| str_at(v, "PermanentMACAddress").filter(|m| !m.is_empty())),
        link_status: str_at(v, "LinkStatus"),
    }
}

pub fn manager(v: &Value, odata_id: &str) -> Manager {
    Manager {
        odata_id: self_link(v, odata_id),
        firmware_version: text_at(v, "FirmwareVersion"),
        manufacturer: text_at(v, "Manufacturer"),
        model: text_at(v, "Model"),
        virtual_media: link_at(v, "VirtualMedia"),
    }
}

pub fn virtual_media(v: &Value, odata_id: &str, etag: Option<String>) -> VirtualMedia {
    let action = |name: &str| {
        v.get("Actions")
            .and_then(|a| a.get(name))
            .and_then(|a| str_at(a, "target"))
    };
    VirtualMedia {
        odata_id: self_link(v, odata_id),
        id: str_at(v, "Id").unwrap_or_default(),
        media_types: strings_at(v, "MediaTypes"),
        image: str_at(v, "Image").filter(|s| !s.is_empty()),
        inserted: v.get("Inserted").and_then(Value::as_bool).unwrap_or(false),
        insert_target: action("#VirtualMedia.InsertMedia"),
        eject_target: action("#VirtualMedia.EjectMedia"),
        etag: etag.or_else(|| str_at(v, "@odata.etag")),
    }
}

/// What a task monitor's answer says: still running, done, or failed (with why).
#[derive(Debug, PartialEq, Eq)]
pub enum TaskProgress {
    Running,
    Done,
    Failed(String),
}

/// A task monitor's `200` body: a `Task` (judged by `TaskState`) or, once done, the
/// operation's own result (anything without `TaskState`).
pub fn task(v: &Value) -> TaskProgress {
    let Some(state) = v.get("TaskState").and_then(Value::as_str) else {
        return TaskProgress::Done;
    };
    match state {
        "Completed" => TaskProgress::Done,
        "Exception" | "Killed" | "Cancelled" => {
            let mut why: Vec<String> = v
                .get("Messages")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|m| str_at(m, "Message")).collect())
                .unwrap_or_default();
            if why.is_empty() {
                why.push(format!("task state {state}"));
            }
            TaskProgress::Failed(why.join("; "))
        }
        _ => TaskProgress::Running,
    }
}

/// The human part of a Redfish error body (`error.message`, else the first extended
/// info message), else the body's start.
pub fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let err = v.get("error");
        let ext = err
            .and_then(|e| e.get("@Message.ExtendedInfo"))
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|m| str_at(m, "Message"));
        if let Some(m) = ext.or_else(|| err.and_then(|e| str_at(e, "message"))) {
            return truncate(&m);
        }
    }
    truncate(String::from_utf8_lossy(body).trim())
}

/// At most 200 bytes (then `…`), line breaks and tabs as spaces, other control
/// characters dropped: the text goes into conditions, events and the CLI's output.
fn truncate(s: &str) -> String {
    const MAX: usize = 200;
    let mut out = String::new();
    for c in s.chars() {
        let c = match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => continue,
            c => c,
        };
        if out.len() + c.len_utf8() > MAX {
            out.push('…');
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn system_reads_boot_actions_links() {
        let v = json!({
            "@odata.id": "/redfish/v1/Systems/1", "Id": "1", "UUID": "ABC",
            "PowerState": "On", "@odata.etag": "W/\"1\"",
            "Boot": {"BootSourceOverrideTarget": "Pxe",
                     "BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Cd"],
                     "HttpBootUri": "http://x/y"},
            "Actions": {"#ComputerSystem.Reset": {"target": "/r", "ResetType@Redfish.AllowableValues": ["On"]}},
            "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/1"}]},
            "VirtualMedia": {"@odata.id": "/redfish/v1/Systems/1/VirtualMedia"}
        });
        let s = system(&v, "/ignored", None);
        assert_eq!(s.power_state, Some(PowerState::On));
        assert_eq!(s.boot.allowed_targets, ["Pxe", "Cd"]);
        assert_eq!(s.boot.http_boot_uri.as_deref(), Some("http://x/y"));
        assert_eq!(s.reset_target.as_deref(), Some("/r"));
        assert_eq!(s.reset_types, ["On"]);
        assert_eq!(s.etag.as_deref(), Some("W/\"1\""));
        assert_eq!(s.managers, ["/redfish/v1/Managers/1"]);
        assert_eq!(
            s.virtual_media.as_deref(),
            Some("/redfish/v1/Systems/1/VirtualMedia")
        );
        // The header ETag wins over @odata.etag.
        assert_eq!(
            system(&v, "/x", Some("\"h\"".into())).etag.as_deref(),
            Some("\"h\"")
        );
    }

    #[test]
    fn task_states() {
        assert_eq!(
            task(&json!({"TaskState": "Running"})),
            TaskProgress::Running
        );
        assert_eq!(task(&json!({"TaskState": "Completed"})), TaskProgress::Done);
        assert_eq!(task(&json!({"Id": "result"})), TaskProgress::Done);
        assert_eq!(
            task(&json!({"TaskState": "Exception", "Messages": [{"Message": "disk on fire"}]})),
            TaskProgress::Failed("disk on fire".into())
        );
        assert_eq!(
            task(&json!({"TaskState": "Killed"})),
            TaskProgress::Failed("task state Killed".into())
        );
    }

    #[test]
    fn descriptive_strings_lose_control_characters() {
        let v = json!({"Manufacturer": "\u{1b}]0;owned\u{7}Acme", "Model": "M\u{9b}1",
            "SerialNumber": "S\r\nN", "BiosVersion": "x".repeat(300), "FirmwareVersion": "1\u{1b}[2J"});
        let s = system(&v, "/redfish/v1/Systems/1", None);
        assert_eq!(s.manufacturer.as_deref(), Some("]0;ownedAcme"));
        assert_eq!(s.model.as_deref(), Some("M1"));
        assert_eq!(s.serial_number.as_deref(), Some("SN"));
        assert_eq!(s.bios_version.map(|b| b.len()), Some(256));
        let m = manager(&v, "/redfish/v1/Managers/1");
        assert_eq!(m.firmware_version.as_deref(), Some("1[2J"));
    }

    #[test]
    fn error_messages() {
        let body = br#"{"error": {"code": "Base.1.0.GeneralError", "message": "see ext",
            "@Message.ExtendedInfo": [{"Message": "the value is bad"}]}}"#;
        assert_eq!(error_message(body), "the value is bad");
        assert_eq!(error_message(b"plain text"), "plain text");
        assert_eq!(
            error_message(b"{\"error\": {\"message\": \"a\\u001b]0;owned\\u0007\\nb\"}}"),
            "a]0;owned b"
        );
        assert_eq!(
            error_message("é".repeat(300).as_bytes()).chars().count(),
            101
        );
    }

    #[test]
    fn an_empty_self_link_keeps_the_path_read_from() {
        // Found by the redfish_json fuzz target: `"@odata.id": ""` made the object's
        // path empty, so every later request on it failed as malformed.
        let v = json!({"@odata.id": "", "Id": "Cd1"});
        let p = "/redfish/v1/Managers/1/VirtualMedia/Cd1";
        assert_eq!(virtual_media(&v, p, None).odata_id, p);
        assert_eq!(
            system(&v, "/redfish/v1/Systems/1", None).odata_id,
            "/redfish/v1/Systems/1"
        );
        assert_eq!(
            manager(&v, "/redfish/v1/Managers/1").odata_id,
            "/redfish/v1/Managers/1"
        );
    }
}
