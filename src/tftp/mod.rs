//! TFTP server (RFC 1350/2347/2348/2349/7440): a pure transfer state machine and a
//! thin tokio socket layer. Owned by issue 5.

use std::sync::Arc;

use crate::serve::Context;
use crate::shutdown::Shutdown;

/// Run the TFTP server until shutdown.
pub async fn serve(_ctx: Arc<Context>, _shutdown: Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("tftp server is not built yet")
}
