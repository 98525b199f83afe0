-- A cluster's base stack version (SPEC section 6 step 4) is chosen when it is created (the newest
-- stack the binary carries) and kept until the cluster is upgraded: a new stack in a release does
-- not move existing clusters. Clusters from before this was recorded at creation ran (or were about
-- to run) the only stack of their release, 2026.11.0.
update clusters set stack_version = '2026.11.0' where stack_version is null;
alter table clusters alter column stack_version set not null;
alter table clusters add constraint clusters_stack_version_format
  check (stack_version ~ '^[0-9]{4}\.[0-9]{1,2}\.[0-9]{1,4}$');
