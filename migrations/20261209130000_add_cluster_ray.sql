-- `kind: ray`: a cluster with a Ray cluster (KubeRay) on its tenant Kubernetes, and its Ray
-- settings (`ray`: version, head pool, dashboard), present exactly for that kind.
alter table clusters drop constraint clusters_kind_check;
alter table clusters add constraint clusters_kind_check check (kind in ('slurm', 'kubernetes', 'ray'));
alter table clusters add column ray jsonb;
alter table clusters add constraint clusters_ray_check check ((kind = 'ray') = (ray is not null));
