//! TLS on the API listener. This file is a stub holding only [`PeerCert`], the request
//! extension the TLS listener inserts for a connection that presented a verified
//! client certificate; [`super::auth`] maps it to an identity. (The `tls` branch
//! brings the listener itself and replaces this file.)

/// The verified client certificate of a connection: CN → user, O (each) → groups.
#[derive(Clone, Debug)]
pub struct PeerCert {
    pub cn: String,
    pub orgs: Vec<String>,
    pub serial_hex: String,
}
