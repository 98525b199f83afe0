-- A BMC reached over plain http is an explicit, recorded choice (`bmc.allow_insecure_http`).
-- Machines enrolled before the rule keep working: an http URL already stored carries the opt-in.
alter table machines add column bmc_allow_insecure_http boolean not null default false;
update machines set bmc_allow_insecure_http = true where bmc_url like 'http://%';
