//! Reconcilers and the small work-queue runtime they run on.
