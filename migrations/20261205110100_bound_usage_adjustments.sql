-- Each component of an adjustment is at most 10^12 seconds either way (about 31,700 years of one
-- node; `paddock_domain::usage::MAX_ADJUSTMENT_SECONDS`), as the API checks (422 naming the
-- field): sums of adjustments then stay far inside 64 bits. Checked for every row written from now
-- on; rows written before stay (adjustments never change), and the sums are checked all the same.
alter table usage_adjustments add constraint usage_adjustments_seconds_bounded check (
    node_seconds between -1000000000000 and 1000000000000
    and gpu_seconds between -1000000000000 and 1000000000000
    and control_plane_seconds between -1000000000000 and 1000000000000
) not valid;
