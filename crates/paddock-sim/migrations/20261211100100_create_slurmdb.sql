-- The simulated Slurm accounting of each tenant cluster (what slurmdbd holds: QOS, accounts, users
-- and associations), as one document per cluster (`paddock_domain::slurm_identity::Slurmdb`).
-- Written by the simulated Slurm driver's identity sync, and by tests playing a tenant's admin who
-- changes it behind paddock's back (`SimWorld::set_slurmdb`).
create table paddock_sim.slurmdb (
    cluster_id uuid primary key,
    state jsonb not null,
    updated_at timestamptz not null default now()
);
