//! iPXE script rendering from editable templates (pure, no I/O). Owned by issue 3.
