//! The store: objects with etcd semantics (global revision, compare-and-swap, watch).
