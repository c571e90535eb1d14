//! DHCP server (proxyDHCP and authoritative) on dhcproto: a pure core
//! (`request + state → reply`) and a thin socket loop. Owned by issue 4.

use std::sync::Arc;

use crate::serve::Context;
use crate::shutdown::Shutdown;

/// Run the DHCP server until shutdown.
pub async fn serve(_ctx: Arc<Context>, _shutdown: Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("dhcp server is not built yet")
}
