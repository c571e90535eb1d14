//! Provisioning job runner (local process, Kubernetes Job). Owned by issue 8.
