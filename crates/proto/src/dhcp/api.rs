//! The DHCP server's REST endpoint, mounted by the API listener behind its
//! authentication and authorization (as the job runner's, [`crate::provision::api`]):
//!
//! - `GET /apis/dhcp.bootplane.dev/v1alpha1/leases` ([`LEASES_PATH`]) →
//!   `{"kind": "LeaseList", "pools": [...], "items": [...]}`: every lease of the
//!   [`LeaseIndex`](super::leases::LeaseIndex) by address, and per configured subnet its
//!   dynamic pool's size and how many active leases fall in it.

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use crate::model::wire::LEASES_PATH;

/// `GET /apis/dhcp.bootplane.dev/v1alpha1/leases`: the DHCP server's leases.
pub fn leases_router(
    idx: super::leases::LeaseIndex,
    subnets: Vec<super::settings::Subnet>,
) -> Router {
    // (subnet, its name, its pool size): the size counted once, not per request.
    let subnets: Arc<Vec<_>> = Arc::new(
        subnets
            .into_iter()
            .map(|s| {
                let name = format!("{}/{}", s.network, s.prefix_len);
                let size = s.pool_size();
                (s, name, size)
            })
            .collect(),
    );
    Router::new().route(
        LEASES_PATH,
        get(move || {
            let (idx, subnets) = (idx.clone(), subnets.clone());
            async move {
                let mut items = idx.all();
                items.sort_by_key(|l| l.ip);
                let pools = pool_usage(&subnets, &items, crate::sys::unix_now());
                axum::Json(
                    json!({"apiVersion": "dhcp.bootplane.dev/v1alpha1", "kind": "LeaseList",
                    "pools": pools, "items": items}),
                )
            }
        }),
    )
}

/// Per configured subnet: its dynamic pool's size and how many active leases fall in it
/// (`pools` of the lease list; the dashboard's pool usage).
fn pool_usage(
    subnets: &[(super::settings::Subnet, String, u64)],
    leases: &[super::leases::Lease],
    now: u64,
) -> Vec<Value> {
    subnets
        .iter()
        .map(|(s, name, size)| {
            let used = leases
                .iter()
                .filter(|l| s.contains(l.ip) && l.active(now))
                .count();
            json!({"subnet": name, "size": size, "used": used})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_usage_counts_active_leases_per_configured_subnet() {
        use super::super::leases::{Lease, LeaseState};
        let d = super::super::DhcpConfig {
            range: Some("10.9.0.100-10.9.0.149".into()),
            ..Default::default()
        };
        let subnets = super::super::DhcpSettings::from_config(&d, "http://10.9.0.1:8080")
            .unwrap()
            .subnets;
        let named: Vec<_> = subnets
            .into_iter()
            .map(|s| {
                let n = format!("{}/{}", s.network, s.prefix_len);
                let size = s.pool_size();
                (s, n, size)
            })
            .collect();
        let lease = |ip: [u8; 4], expires, state| Lease {
            ip: ip.into(),
            mac: [2, 0, 0, 0, 0, ip[3]],
            hostname: None,
            expires,
            state,
        };
        let leases = [
            lease([10, 9, 0, 100], 2000, LeaseState::Bound),
            lease([10, 9, 0, 101], 500, LeaseState::Bound), // expired
            lease([10, 9, 0, 102], 2000, LeaseState::Released),
            lease([10, 8, 0, 5], 2000, LeaseState::Bound), // another network
        ];
        let p = pool_usage(&named, &leases, 1000);
        assert_eq!(
            p,
            vec![json!({"subnet": "10.9.0.0/24", "size": 50, "used": 1})]
        );
    }
}
