-- The container images each machine holds, as its agent last reported them: a heartbeat carries
-- them only when they changed. Read with a machine alone (api/machines.rs), never with a list.
ALTER TABLE machines ADD COLUMN images jsonb NOT NULL DEFAULT '[]';
