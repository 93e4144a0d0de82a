-- `restart_policy: OnFailure`: a worker that failed while it ran waits on its machine, keeping
-- what it holds there, until `restart_at`, then its agent is told to start it again. The
-- restart controller clears `restart_at` once it has passed and wakes the machine's agent in
-- the same statement; `assigned_to` lists only workers without one.
ALTER TABLE workers
    ADD COLUMN restarts   integer NOT NULL DEFAULT 0 CONSTRAINT workers_restarts_check CHECK (restarts >= 0),
    ADD COLUMN restart_at timestamptz;

CREATE INDEX workers_restart_due_idx ON workers (restart_at) WHERE restart_at IS NOT NULL;
