//! `bootplane token create|list|revoke`: named API tokens (`api::auth`), through the
//! API, so it works from any machine an admin can reach the API from. `create` prints
//! the token once (the server keeps only its hash); `revoke` deletes the token's
//! `APIToken` object, after which requests with it are refused (401). Tokens expire
//! after 90 days unless `--ttl` says otherwise (`--ttl never` for none); `list` shows
//! when each was last used (recorded by the server at most once a minute).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{Client, Conn};

const TOKENS_PATH: &str = "/apis/auth.bootplane.dev/v1alpha1/apitokens";

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create a token NAME with role ROLE and print it (it is shown only this once).
    Create(CreateArgs),
    /// List tokens: name, role, created, expires, last used (never the tokens).
    List(ListArgs),
    /// Revoke a token: requests with it are refused from then on.
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The token's name (a DNS label): the user it authenticates as.
    pub name: String,
    /// Its role: admin, operator, viewer, agent, metrics or a role from `[[api.roles]]`.
    #[arg(long)]
    pub role: String,
    /// Lifetime: a number with s, m, h or d (`90m`, `24h`, `365d`), or `never` (or
    /// `0`) for no expiry; default 90 days.
    #[arg(long)]
    pub ttl: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The token's name.
    pub name: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// `--ttl` as `spec.ttlSeconds`: `never` or `0` → 0 (no expiry), else [`parse_ttl`].
pub(crate) fn ttl_seconds(s: &str) -> Result<u64> {
    match s.trim() {
        "never" | "0" => Ok(0),
        t => parse_ttl(t),
    }
}

/// `90m` → 5400: a positive number of s, m, h or d.
pub(crate) fn parse_ttl(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .with_context(|| format!("invalid ttl {s:?} (e.g. 90m, 24h, 30d)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("invalid ttl {s:?}: the unit must be s, m, h or d"),
    };
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => bail!("invalid ttl {s:?}"),
    }
}

pub fn run(cmd: TokenCmd) -> Result<u8> {
    match cmd {
        TokenCmd::Create(a) => {
            let client = Client::new(&a.conn)?;
            let mut spec = json!({"role": a.role});
            // Without --ttl the server's default (90 days) applies.
            if let Some(t) = &a.ttl {
                spec["ttlSeconds"] = Value::from(ttl_seconds(t)?);
            }
            let body = json!({
                "apiVersion": "auth.bootplane.dev/v1alpha1", "kind": "APIToken",
                "metadata": {"name": a.name}, "spec": spec,
            });
            let v = client.request("POST", TOKENS_PATH, Some(("application/json", &body)))?;
            let token = v
                .pointer("/status/token")
                .and_then(Value::as_str)
                .context("the server returned no token")?;
            println!("{token}");
            eprintln!(
                "token {} created (role {}); it is not shown again",
                a.name, a.role
            );
            Ok(0)
        }
        TokenCmd::List(a) => {
            let client = Client::new(&a.conn)?;
            let v = client.request("GET", TOKENS_PATH, None)?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|t| {
                    let s = |p: &str| {
                        t.pointer(p)
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string()
                    };
                    let exp = s("/spec/expiresAt");
                    let used = t
                        .pointer("/metadata/annotations")
                        .and_then(|a| a.get(crate::model::wire::LAST_USED))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    vec![
                        s("/metadata/name"),
                        s("/spec/role"),
                        s("/metadata/creationTimestamp"),
                        if exp.is_empty() { "never".into() } else { exp },
                        if used.is_empty() {
                            "never".into()
                        } else {
                            used.to_string()
                        },
                    ]
                })
                .collect();
            let header = ["NAME", "ROLE", "CREATED", "EXPIRES", "LAST USED"].map(String::from);
            let table: Vec<Vec<String>> = std::iter::once(header.to_vec()).chain(rows).collect();
            print!("{}", super::table::format_rows(&table));
            Ok(0)
        }
        TokenCmd::Revoke(a) => {
            let client = Client::new(&a.conn)?;
            client.request("DELETE", &format!("{TOKENS_PATH}/{}", a.name), None)?;
            println!("token {} revoked", a.name);
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ttls() {
        assert_eq!(super::parse_ttl("90m").unwrap(), 5400);
        assert_eq!(super::parse_ttl("2d").unwrap(), 172_800);
        assert_eq!(super::parse_ttl("15s").unwrap(), 15);
        for bad in ["", "0h", "10", "h", "5w", "-1h", "99999999999999999999d"] {
            assert!(super::parse_ttl(bad).is_err(), "{bad}");
        }
        assert_eq!(super::ttl_seconds("never").unwrap(), 0);
        assert_eq!(super::ttl_seconds("0").unwrap(), 0);
        assert_eq!(super::ttl_seconds("24h").unwrap(), 86_400);
        assert!(super::ttl_seconds("nope").is_err());
    }
}
