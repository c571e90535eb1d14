//! NFS export backends and export-policy enforcement. Owned by issue 8.
