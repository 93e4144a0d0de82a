-- How fast a copy fills: when its bytes last changed, and an earlier observation to measure
-- the rate against. Both change only with a heartbeat that reports new bytes
-- (store::copies::reconcile), so a repeated heartbeat still writes nothing.
ALTER TABLE copies
    ADD COLUMN bytes_at       timestamptz,
    ADD COLUMN progress_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN progress_at    timestamptz;
