"""Recovery: in-doubt leases, cross-queue recovery, reconciliation."""
