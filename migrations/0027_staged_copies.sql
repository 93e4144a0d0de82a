-- Copies filled ahead for a run that waits for resources (stage-in): the fill controller fills
-- such a copy while the run still has Pending workers, as it does for a worker bound there.
ALTER TABLE copies ADD COLUMN staged_for uuid REFERENCES runs (id) ON DELETE SET NULL;
CREATE INDEX copies_staging_idx ON copies (staged_for) WHERE staged_for IS NOT NULL AND state = 'Filling';
