-- The simulated world moved out of the production schema: `paddock-sim` keeps it in its own schema
-- (`paddock_sim`) with its own migrations (crates/paddock-sim/migrations), applied only by processes
-- that run a simulated driver. This drops what 20261130160000_create_sim_world.sql created here
-- (three tables; their indexes and constraints go with them). A simulated world kept in an
-- upgraded database starts afresh in the new schema: simulated machines are created again on first
-- contact, powered off.
drop table if exists sim_nodes, sim_clusters, sim_machines;
