//! Names on the wire that no CRD declares but that the server and its clients must
//! agree on: the annotations the server acts on or writes, and the paths of the API's
//! routes that are not stored resources. Here, below both, so that the CLI names them
//! without importing the API, the controllers or the protocol servers that serve them.

/// Annotation asking for a Server's restart (`bootplane power reset SERVER` sets it):
/// the server controller hands it to the power driver once, then removes it.
pub const RESET_ANNOTATION: &str = "bootplane.dev/reset-requested";

/// The annotation of an `APIToken` holding when it was last used (RFC 3339, to the
/// minute; written by the API at most once a minute per token).
pub const LAST_USED: &str = "auth.bootplane.dev/last-used";

/// Path of the read-only DHCP lease list (`bootplane get leases`).
pub const LEASES_PATH: &str = "/apis/dhcp.bootplane.dev/v1alpha1/leases";

/// Path prefix of the boot preview routes (`.../ignition/NAME`, `.../ipxe/NAME`;
/// `bootplane render ignition|ipxe --server NAME`).
pub const PREVIEW_PATH: &str = "/apis/boot.bootplane.dev/v1alpha1/render";
