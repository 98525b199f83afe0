-- The tenant base stack version a cluster runs (SPEC section 6 step 4), recorded by the worker
-- once it applied it.
alter table clusters add column stack_version text;
