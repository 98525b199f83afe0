-- Agent contract, revision 2 (SPEC section 5): a run's seed token (the only secret in a URL, the
-- one the BMC fetches the seed with) is stored as its SHA-256, as the single token was; the agent
-- token is derived from it (HMAC-SHA256 under the server key) when the seed is generated, never
-- stored: only its SHA-256 is kept, for the bearer lookup of `config` and `report`. A nonce per run
-- (random, base64url, not a secret) is echoed by the report. Why a report failed is kept with it.
--
-- Tokens issued under revision 1 have no agent token and can never be used: they end now.

alter table agent_tokens rename column token_sha256 to seed_sha256;
alter table agent_tokens add column agent_sha256 bytea;
alter table agent_tokens add column nonce text;
alter table agent_tokens add column failure text;
update agent_tokens set expires_at = least(expires_at, now()), agent_sha256 = sha256(seed_sha256 || id::text::bytea),
    nonce = '' where agent_sha256 is null;
alter table agent_tokens alter column agent_sha256 set not null;
alter table agent_tokens alter column nonce set not null;
alter table agent_tokens add constraint agent_tokens_agent_sha256_key unique (agent_sha256);
alter table agent_tokens add constraint agent_tokens_failure_only_unverified check (failure is null or verified = false);
