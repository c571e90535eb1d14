//! The store on etcd: the [`super::backend::KvBackend`] seam implemented on an etcd
//! v3 cluster shared by several appliances (`[store] backend = "etcd"`).
pub mod client;
