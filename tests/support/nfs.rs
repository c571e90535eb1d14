//! NFS clients in tests: libnfs's tools (`nfs-cat`, `nfs-ls`) run inside a network
//! namespace (see [`Netns::with_loopback_sources`] for how the server sees the client's
//! address) with a 20 s limit, and the check that an access was refused.

use super::netns::Netns;

/// Run the NFS client `tool` on `url` inside `ns`: Ok(stdout) or Err(stderr and status).
pub fn nfs_client(ns: &Netns, tool: &str, url: &str) -> Result<Vec<u8>, String> {
    let out = std::process::Command::new("timeout")
        .args(["20", "ip", "netns", "exec", &ns.name, tool, url])
        .output()
        .expect("running nfs client");
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{} (status {})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))
    }
}

/// Assert that an NFS client run was refused with a permission error.
pub fn assert_denied(r: Result<impl AsRef<[u8]>, String>, what: &str) {
    match r {
        Ok(out) => panic!(
            "{what}: expected access denied, read {:?}",
            String::from_utf8_lossy(out.as_ref())
        ),
        Err(e) => assert!(
            e.contains("Permission denied") || e.contains("ACCES") || e.contains("PERM"),
            "{what}: expected a permission error, got {e}"
        ),
    }
}
