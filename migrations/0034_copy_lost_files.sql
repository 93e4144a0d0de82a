-- What a copy that was whole lost since it was filled, as its agent found by comparing it with
-- its manifest: `{"count": N, "named": [paths]}`; kept until the copy is whole again.
ALTER TABLE copies ADD COLUMN lost jsonb;
