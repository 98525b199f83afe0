-- The id the server gives every request, kept beside the client-chosen request id (which two
-- callers may share): the audit trail's correlation no client can forge. Null on older events.
alter table audit_events add column server_request_id uuid;
