-- Workspaces, tokens, clusters, host-path grants, drives, runs, workers and secrets.
-- Every "exactly one" is a named constraint, so the API maps a violation to a clear 409.

CREATE TABLE workspaces (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CONSTRAINT workspaces_name_key UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Tokens are JWTs; only their ids are kept, so a token can be revoked and never read back.
CREATE TABLE tokens (
    id            uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('viewer', 'editor', 'admin')),
    org_admin     boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);
CREATE INDEX tokens_workspace_idx ON tokens (workspace_id, created_at);

CREATE TABLE clusters (
    name        text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO clusters (name) VALUES ('main');

-- Host paths an organisation admin granted a workspace on a cluster.
CREATE TABLE host_path_grants (
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    cluster       text NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
    path          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT host_path_grants_pkey PRIMARY KEY (workspace_id, cluster, path)
);

CREATE TABLE drives (
    id            uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    cluster       text NOT NULL REFERENCES clusters (name),
    labels        jsonb NOT NULL DEFAULT '{}',
    spec          jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT drives_workspace_name_key UNIQUE (workspace_id, name)
);

-- Values are sealed (ChaCha20-Poly1305) with a key derived from the server's signing key.
CREATE TABLE secrets (
    id            uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    keys          text[] NOT NULL,
    sealed        bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT secrets_workspace_name_key UNIQUE (workspace_id, name)
);

CREATE TABLE runs (
    id            uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    cluster       text NOT NULL REFERENCES clusters (name),
    labels        jsonb NOT NULL DEFAULT '{}',
    spec          jsonb NOT NULL,
    state         text NOT NULL DEFAULT 'Pending',
    reason        text NOT NULL DEFAULT 'Waiting for workers to start',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_workspace_name_key UNIQUE (workspace_id, name)
);
CREATE INDEX runs_live_idx ON runs (workspace_id, id) WHERE state NOT IN ('Completed', 'Failed');

-- The drives a run mounts. Creating a run locks each drive row FOR SHARE, so a drive's
-- deletion and a new run that mounts it are serialised by Postgres.
CREATE TABLE run_mounts (
    run_id    uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    drive_id  uuid NOT NULL REFERENCES drives (id) ON DELETE CASCADE,
    CONSTRAINT run_mounts_pkey PRIMARY KEY (run_id, drive_id)
);
CREATE INDEX run_mounts_drive_idx ON run_mounts (drive_id);

CREATE TABLE workers (
    id            uuid PRIMARY KEY,
    run_id        uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    index         integer NOT NULL,
    state         text NOT NULL DEFAULT 'Pending',
    reason        text NOT NULL DEFAULT 'Waiting for a machine',
    exit_code     integer,
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz,
    CONSTRAINT workers_workspace_name_key UNIQUE (workspace_id, name),
    CONSTRAINT workers_run_index_key UNIQUE (run_id, index)
);
CREATE INDEX workers_pending_idx ON workers (created_at) WHERE state = 'Pending';
