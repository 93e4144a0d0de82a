-- Machines, their join tokens, and what the agents report: worker placement and logs.

-- Join tokens are opaque; only a SHA-256 of each is kept.
CREATE TABLE join_tokens (
    id           uuid PRIMARY KEY,
    cluster      text NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
    secret_hash  bytea NOT NULL CONSTRAINT join_tokens_secret_hash_key UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);

CREATE TABLE machines (
    id                 uuid PRIMARY KEY,
    cluster            text NOT NULL REFERENCES clusters (name),
    name               text NOT NULL,
    pool               text NOT NULL DEFAULT 'default',
    labels             jsonb NOT NULL DEFAULT '{}',
    transports         text[] NOT NULL DEFAULT '{}',
    cpu_millis         integer NOT NULL,
    memory_bytes       bigint NOT NULL,
    gpus               integer NOT NULL,
    -- Held by workers placed here and not yet ended. Raised only by a conditional UPDATE that
    -- checks capacity, so a machine is never over-committed, whatever the number of replicas.
    cpu_alloc          integer NOT NULL DEFAULT 0,
    memory_alloc       bigint NOT NULL DEFAULT 0,
    gpus_alloc         integer NOT NULL DEFAULT 0,
    state              text NOT NULL DEFAULT 'Ready',
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    credential_id      uuid NOT NULL,
    data_proposed      text,
    data_path          text,
    data_limit_bytes   bigint,
    data_total_bytes   bigint NOT NULL DEFAULT 0,
    data_used_bytes    bigint NOT NULL DEFAULT 0,
    data_free_bytes    bigint NOT NULL DEFAULT 0,
    -- Bumped whenever the machine's assignments change; agents long-poll on it.
    assign_version     bigint NOT NULL DEFAULT 1,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT machines_cluster_name_key UNIQUE (cluster, name),
    CONSTRAINT machines_alloc_nonnegative CHECK (cpu_alloc >= 0 AND memory_alloc >= 0 AND gpus_alloc >= 0)
);

ALTER TABLE workers
    ADD COLUMN machine_id    uuid REFERENCES machines (id) ON DELETE SET NULL,
    ADD COLUMN cpu_millis    integer NOT NULL DEFAULT 0,
    ADD COLUMN memory_bytes  bigint NOT NULL DEFAULT 0,
    ADD COLUMN gpus          integer NOT NULL DEFAULT 0,
    -- Bound and free to start: the agent runs released workers that have not ended.
    ADD COLUMN released      boolean NOT NULL DEFAULT false,
    ADD COLUMN log_lines     bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_dropped   bigint NOT NULL DEFAULT 0;
CREATE INDEX workers_machine_idx ON workers (machine_id) WHERE state NOT IN ('Completed', 'Failed');

CREATE TABLE worker_logs (
    id         bigserial PRIMARY KEY,
    worker_id  uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT now(),
    stream     text NOT NULL,
    line       text NOT NULL
);
CREATE INDEX worker_logs_worker_idx ON worker_logs (worker_id, id);
