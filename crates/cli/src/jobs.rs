//! `bootplane get jobs [ID]`: the provisioning job runner's jobs (not a stored
//! resource: `GET /apis/bootplane.dev/v1alpha1/jobs`, see `crate::provision::api`),
//! as a table or `-o json|yaml`.

use anyhow::Result;
use serde_json::Value;

use super::Client;

/// Print one job (`id`) or every job the runner knows.
pub(crate) fn get(client: &Client, id: Option<&str>, output: Option<&str>) -> Result<u8> {
    let path = crate::provision::api::JOBS_PATH;
    let v = match id {
        Some(id) => client.request(
            "GET",
            &format!(
                "{path}/{}",
                percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
            ),
            None,
        )?,
        None => client.request("GET", path, None)?,
    };
    match output {
        Some("json") => println!("{}", serde_json::to_string_pretty(&v)?),
        Some("yaml") => print!("{}", serde_norway::to_string(&v)?),
        _ => {
            let items = match id {
                Some(_) => vec![v],
                None => v
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            };
            if items.is_empty() {
                eprintln!("No jobs found.");
                return Ok(0);
            }
            print!("{}", table(&items));
        }
    }
    Ok(0)
}

/// ID, SERVER, STATE, ATTEMPTS, PROGRESS, AGE, REASON.
fn table(items: &[Value]) -> String {
    let mut rows = vec![[
        "ID", "SERVER", "STATE", "ATTEMPTS", "PROGRESS", "AGE", "REASON",
    ]
    .map(String::from)
    .to_vec()];
    for j in items {
        let s = |k: &str| j.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let done = j.pointer("/progress/bytes").and_then(Value::as_u64);
        let total = j.pointer("/progress/total").and_then(Value::as_u64);
        let progress = match (done, total) {
            (Some(d), Some(t)) if t > 0 => format!("{}%", d.saturating_mul(100) / t),
            (Some(d), _) => format!("{d}B"),
            _ => "-".into(),
        };
        let age = match j.get("startedAt").and_then(Value::as_str) {
            Some(t) => super::table::age(Some(t)),
            None => "-".into(),
        };
        let attempts = j.get("attempts").and_then(Value::as_u64).unwrap_or(0);
        rows.push(vec![
            s("id"),
            s("server"),
            s("state"),
            attempts.to_string(),
            progress,
            age,
            s("reason"),
        ]);
    }
    super::table::format_rows(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns() {
        let now = chrono::Utc::now();
        let started = (now - chrono::Duration::seconds(90)).to_rfc3339();
        let items = vec![serde_json::json!({
            "id": "j1", "server": "s1", "state": "Running", "attempts": 1,
            "progress": {"bytes": 50, "total": 200}, "startedAt": started
        })];
        let t = table(&items);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("ID"), "{t}");
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(&words[..5], ["j1", "s1", "Running", "1", "25%"], "{t}");
    }
}
