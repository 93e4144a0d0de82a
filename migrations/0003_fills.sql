-- Copies of drives on machines, and fill runs: exactly one per drive and machine.

CREATE TABLE copies (
    id            uuid PRIMARY KEY,
    drive_id      uuid NOT NULL REFERENCES drives (id) ON DELETE CASCADE,
    machine_id    uuid NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    -- Filling until the agent reports the marker; Evicting until the agent reports it gone.
    state         text NOT NULL DEFAULT 'Filling'
                  CONSTRAINT copies_state_check CHECK (state IN ('Filling', 'Complete', 'Failed', 'Evicting')),
    bytes         bigint NOT NULL DEFAULT 0,
    -- Room promised to the copy while it fills: the drive's size_hint_bytes.
    size_hint     bigint NOT NULL DEFAULT 0,
    evictable     boolean NOT NULL DEFAULT false,
    last_used_at  timestamptz,
    completed_at  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT copies_drive_machine_key UNIQUE (drive_id, machine_id)
);
CREATE INDEX copies_machine_idx ON copies (machine_id);

ALTER TABLE runs
    ADD COLUMN fill_drive_id    uuid REFERENCES drives (id) ON DELETE CASCADE,
    ADD COLUMN fill_machine_id  uuid REFERENCES machines (id) ON DELETE CASCADE;
-- The one fill run of a drive on a machine.
CREATE UNIQUE INDEX runs_one_fill_per_copy ON runs (fill_drive_id, fill_machine_id) WHERE fill_drive_id IS NOT NULL;

-- What a bound worker holds on its machine. A fill may hold less than it asks: the workers that
-- wait for it lend it theirs, as an init container runs inside its pod's request.
ALTER TABLE workers
    ADD COLUMN cpu_charged     integer NOT NULL DEFAULT 0,
    ADD COLUMN memory_charged  bigint NOT NULL DEFAULT 0,
    ADD COLUMN gpus_charged    integer NOT NULL DEFAULT 0,
    -- How each drive is reached: local, nfs or rdma, by drive full name.
    ADD COLUMN transports      jsonb NOT NULL DEFAULT '{}';
