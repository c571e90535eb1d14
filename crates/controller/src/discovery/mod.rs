//! Discovery: how machines enter the fleet by themselves. BMCs found on the management
//! network become Endpoints, BMCs and BMCSecrets; a BMC's systems become Servers
//! ([`super::systems`]); each new Server boots once into the discovery image, whose
//! agent (`bootplane probe`) reports the inventory ([`super::inventory`]), and only then
//! is it `Available` ([`super::firstboot`]).

pub mod endpoints;
pub mod macdb;
pub mod settings;

pub use endpoints::Management;
pub use macdb::MacDb;
pub use settings::DiscoveryConfig;
