//! Resource types (serde) and the kube-style REST API on the operator listener.
