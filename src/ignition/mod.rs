//! Ignition rendering: Butane → Ignition translation, per-machine templates,
//! validation. Pure: no I/O while rendering. Owned by issue 6.
