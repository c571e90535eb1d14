//! Power drivers behind one trait (manual, test; QEMU and Redfish later).
