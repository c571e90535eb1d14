//! The one `set_rules` path the export backends share, [`set_rules`]: the rules are
//! checked and put in index order ([`normalize_rules`]), compared with the rules the
//! backend has in force for the export, and a change is applied and recorded, while
//! no change only makes sure the recorded rules are in force. A backend
//! ([`RuleTarget`]) supplies only what differs: how an export is opened, how its rules
//! in force are read back, and how a change is made (ganesha and knfsd render the whole
//! list; ONTAP removes the stale rules and adds the missing ones).

use std::future::Future;

use super::{normalize_rules, ExportRule, NfsError};

/// How the rules in force (`A`, as the backend reads them back) differ from the
/// desired ones.
pub(crate) struct RuleDiff<'a, A> {
    /// Rules in force that no desired rule equals: to remove (before anything is added,
    /// so a revoked client never holds access in between).
    pub stale: Vec<&'a A>,
    /// Desired rules that nothing in force equals: to add.
    pub missing: Vec<&'a ExportRule>,
}

impl<'a, A> RuleDiff<'a, A> {
    /// `same(desired, applied)` tells whether a rule in force is a desired rule.
    pub(crate) fn new(
        applied: &'a [A],
        desired: &'a [ExportRule],
        same: impl Fn(&ExportRule, &A) -> bool,
    ) -> Self {
        RuleDiff {
            stale: applied
                .iter()
                .filter(|a| !desired.iter().any(|d| same(d, a)))
                .collect(),
            missing: desired
                .iter()
                .filter(|d| !applied.iter().any(|a| same(d, a)))
                .collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.stale.is_empty() && self.missing.is_empty()
    }
}

/// A backend's side of [`set_rules`]: one export, opened for a rule change by the
/// backend and held until the change is made (ganesha and knfsd hold their lock in it,
/// so changes do not interleave).
pub(crate) trait RuleTarget: Send {
    /// A rule as the backend has it in force.
    type Applied: Send + Sync;

    /// The rules in force for the export.
    fn in_force(&mut self) -> impl Future<Output = Result<Vec<Self::Applied>, NfsError>> + Send;

    /// Whether a rule in force is the desired rule.
    fn same(desired: &ExportRule, applied: &Self::Applied) -> bool;

    /// The rules in force are `rules` already: make sure they are in effect (ganesha:
    /// its server running; knfsd: the exports file rendered and applied again).
    fn unchanged(
        &mut self,
        rules: &[ExportRule],
    ) -> impl Future<Output = Result<(), NfsError>> + Send;

    /// Puts `rules` in force (`diff` is the change from the rules in force) and records
    /// them; done when the future resolves.
    fn change(
        &mut self,
        rules: &[ExportRule],
        diff: &RuleDiff<'_, Self::Applied>,
    ) -> impl Future<Output = Result<(), NfsError>> + Send;
}

/// [`super::ExportBackend::set_rules`] for every backend (see the module doc): `open`
/// opens the export ([`NfsError::UnknownExport`] when it does not exist) once the rules
/// are found valid.
pub(crate) async fn set_rules<T: RuleTarget>(
    rules: Vec<ExportRule>,
    open: impl Future<Output = Result<T, NfsError>>,
) -> Result<(), NfsError> {
    let rules = normalize_rules(rules)?;
    let mut target = open.await?;
    let in_force = target.in_force().await?;
    let diff = RuleDiff::new(&in_force, &rules, T::same);
    if diff.is_empty() {
        target.unchanged(&rules).await
    } else {
        target.change(&rules, &diff).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs::Access;

    #[test]
    fn diff_finds_stale_and_missing_rules() {
        let r = |index, client: &str| ExportRule::read_only(index, client.parse().unwrap());
        let applied = [r(1, "10.0.0.1"), r(2, "10.0.0.2"), r(3, "10.0.0.3")];
        let mut changed = r(2, "10.0.0.2");
        changed.access = Access::Rw;
        let desired = [r(1, "10.0.0.1"), changed.clone(), r(4, "10.0.0.4")];
        let d = RuleDiff::new(&applied, &desired, |a, b| a == b);
        assert_eq!(d.stale, [&applied[1], &applied[2]]);
        assert_eq!(d.missing, [&changed, &desired[2]]);
        assert!(!d.is_empty());
        assert!(RuleDiff::new(&applied, &applied, |a, b| a == b).is_empty());
        assert!(RuleDiff::<ExportRule>::new(&[], &[], |a, b| a == b).is_empty());
    }
}
