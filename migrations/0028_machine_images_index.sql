-- Placement asks which machines hold the images a pass's workers run: a containment lookup
-- per image, through this index, rather than a read of every machine's report.
CREATE INDEX machines_images_idx ON machines USING gin (images jsonb_path_ops);
