-- A scheduler pass whose runs name their machines (every fill, every pinned run) reads only
-- those, by name in any cluster, rather than the whole fleet.
CREATE INDEX machines_name_idx ON machines (name);
