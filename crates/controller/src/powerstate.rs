//! What power means for a Server's record: its boot generation (annotation
//! `bootplane.dev/boot-generation`: how a reset and a power-off seen move it on, and the
//! boot id signed tokens are bound to) and a power driver's answer written into its
//! status. Shared by the Server reconciler and the first boot ([`super::firstboot`]).

use serde_json::Value;

use super::set_condition;
use crate::model::views::{PowerState, Server, ServerBootConfiguration};
use crate::power::Outcome;

/// Annotation holding the server's boot generation: `N` (a count of the boots
/// bootplane ended or restarted), `N-off` once the current power-off is counted. Written
/// by this reconciler only (the `agent` role cannot write Servers); the boot index folds
/// `N` into the boot id signed tokens are bound to.
pub(crate) const BOOT_GENERATION_ANNOTATION: &str = "bootplane.dev/boot-generation";

/// The suffix of a generation whose power-off is counted already.
const SEALED_OFF: &str = "-off";

/// `server`'s boot generation and whether its current power-off is counted in it.
pub(crate) fn boot_generation(server: &Server) -> (u64, bool) {
    let v =
        (server.metadata.annotations.get(BOOT_GENERATION_ANNOTATION)).map_or("0", String::as_str);
    let (n, off) = match v.strip_suffix(SEALED_OFF) {
        Some(n) => (n, true),
        None => (v, false),
    };
    (n.parse().unwrap_or(0), off)
}

/// The generation annotation `server` needs for its recorded power state, when it
/// differs from the one it has: a power-off seen is counted once (sealed with
/// [`SEALED_OFF`]), a power-on after it unseals.
pub(crate) fn generation_after_power(server: &Server) -> Option<String> {
    let (n, off) = boot_generation(server);
    let recorded = (server.metadata.annotations).contains_key(BOOT_GENERATION_ANNOTATION);
    match server.status.power_state {
        // Off and never counted: no boot bootplane saw has ended (a reset always writes
        // the annotation first), so a Server registered powered off costs no write.
        Some(PowerState::Off) if !recorded => None,
        // On and never counted: record generation 0, so the power-off that ends this
        // boot is counted.
        Some(PowerState::On) if !recorded => Some("0".to_string()),
        Some(PowerState::Off) if !off => Some(format!("{}{SEALED_OFF}", n.saturating_add(1))),
        Some(PowerState::On) if off => Some(n.to_string()),
        _ => None,
    }
}

/// The generation annotation before a reset of `server` is handed to the driver: the
/// next one, unsealed (the server is on afterwards).
pub(crate) fn generation_before_reset(server: &Server) -> String {
    boot_generation(server).0.saturating_add(1).to_string()
}

/// The boot id of Server `server` claimed with boot configuration `sbc`:
/// `<sbc uid>/<sbc generation>/<boot generation>` ([`boot_generation`]).
pub fn claimed_boot_id(server: &Server, sbc: &ServerBootConfiguration) -> String {
    format!("{}/{}", sbc.boot_id(), boot_generation(server).0)
}

/// A power driver's answer into `status`: `done` when it is applied, else `PowerReady`
/// False with why (`Pending`, the driver's retry reason, or `err_reason` and the error).
pub(crate) fn record_power(
    status: &mut Value,
    r: anyhow::Result<Outcome>,
    err_reason: &str,
    done: impl FnOnce(&mut Value),
) {
    match r {
        Ok(Outcome::Done) => done(status),
        Ok(Outcome::Pending(msg)) => {
            set_condition(status, "PowerReady", false, "Pending", &msg);
        }
        Ok(Outcome::Retrying(reason, msg)) => {
            set_condition(status, "PowerReady", false, reason, &msg);
        }
        Err(e) => {
            set_condition(status, "PowerReady", false, err_reason, &format!("{e:#}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::views::read;
    use serde_json::json;

    fn server(generation: Option<&str>, power: &str) -> Server {
        let mut s = json!({"metadata": {"name": "a"}, "status": {"powerState": power}});
        if let Some(g) = generation {
            s["metadata"]["annotations"] = json!({BOOT_GENERATION_ANNOTATION: g});
        }
        read(&s)
    }

    #[test]
    fn a_power_off_is_counted_once_and_a_reset_always() {
        // Never counted, on: generation 0 is recorded (once), so its power-off counts.
        assert_eq!(boot_generation(&server(None, "On")), (0, false));
        assert_eq!(
            generation_after_power(&server(None, "On")).as_deref(),
            Some("0")
        );
        assert_eq!(generation_after_power(&server(Some("0"), "On")), None);
        // Registered powered off: nothing to count, no write.
        assert_eq!(generation_after_power(&server(None, "Off")), None);
        // Seen off after a boot: the next generation, sealed; seen off again: nothing more.
        let v = generation_after_power(&server(Some("0"), "Off")).unwrap();
        assert_eq!(v, "1-off");
        assert_eq!(boot_generation(&server(Some(&v), "Off")), (1, true));
        assert_eq!(generation_after_power(&server(Some(&v), "Off")), None);
        // On again: unsealed, same generation (the boot it starts is the one counted).
        let v = generation_after_power(&server(Some(&v), "On")).unwrap();
        assert_eq!(v, "1");
        assert_eq!(generation_after_power(&server(Some(&v), "On")), None);
        // The next power-off counts again.
        assert_eq!(
            generation_after_power(&server(Some(&v), "Off")).as_deref(),
            Some("2-off")
        );
        // Other states (unknown, paused) change nothing.
        assert_eq!(
            generation_after_power(&server(Some("3-off"), "Paused")),
            None
        );
        assert_eq!(generation_after_power(&server(Some("3"), "")), None);
        // A reset always moves on, whether the server was on or off.
        assert_eq!(generation_before_reset(&server(Some("3"), "On")), "4");
        assert_eq!(generation_before_reset(&server(Some("3-off"), "Off")), "4");
        assert_eq!(generation_before_reset(&server(None, "On")), "1");
        // A value that is not a generation counts as none.
        assert_eq!(boot_generation(&server(Some("x"), "On")), (0, false));
    }

    #[test]
    fn the_boot_id_moves_with_the_claim_its_configuration_and_the_generation() {
        let sbc = json!({"metadata": {"uid": "u-1", "generation": 2}});
        let id = |g: Option<&str>, sbc: &Value| claimed_boot_id(&server(g, "On"), &read(sbc));
        assert_eq!(id(None, &sbc), "u-1/2/0");
        assert_eq!(id(Some("4-off"), &sbc), "u-1/2/4");
        assert_ne!(id(Some("5"), &sbc), id(Some("4"), &sbc));
        let other = json!({"metadata": {"uid": "u-2", "generation": 2}});
        assert_ne!(id(Some("4"), &other), id(Some("4"), &sbc));
    }
}
