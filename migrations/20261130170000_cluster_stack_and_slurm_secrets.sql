-- The tenant base stack version a cluster runs (SPEC section 6 step 4), recorded by the worker
-- once it applied it.
alter table clusters add column stack_version text;

-- The secrets of a cluster's Slurm (slurm key, JWT key, accounting database password), generated
-- once, AES-256-GCM bound to (clusters, slurm_secrets_enc, id); re-applied unchanged.
alter table clusters add column slurm_secrets_enc bytea;
