-- Free space the agent keeps on its data location's disk: below it, unused copies are evicted.
ALTER TABLE machines ADD COLUMN data_reserve_bytes bigint NOT NULL DEFAULT 0
    CONSTRAINT machines_data_reserve_nonnegative CHECK (data_reserve_bytes >= 0);
