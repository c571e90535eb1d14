//! The machine-facing HTTP boot listener. Owned by issue 3.
