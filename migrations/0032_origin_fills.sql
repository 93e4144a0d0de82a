-- At most this many fills from the origin (a drive's fill template) at once in the cluster, set by
-- an organisation admin; NULL for no limit. Fills beyond it wait (controllers::fill).
ALTER TABLE clusters ADD COLUMN max_origin_fills integer
    CONSTRAINT clusters_max_origin_fills_check CHECK (max_origin_fills BETWEEN 1 AND 100000);
