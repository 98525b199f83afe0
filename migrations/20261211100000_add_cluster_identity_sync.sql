-- The last sync of a tenant's people (its SCIM users and groups) into a Slurm cluster's accounting
-- (docs/tenants.md, "People in your Slurm"): when it completed and how many users, accounts and
-- associations it wrote, rendered as the cluster's `status.identity`. Counts only: the names stay
-- in the identity tables and in the cluster's own Slurm. Written by the cluster's identity sync
-- job, apart from the reconciler's guarded status, so the two never contend for one version.
alter table clusters add column identity_sync jsonb;
