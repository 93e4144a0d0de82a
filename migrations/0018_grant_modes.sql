-- A host-path grant says whether workers may write beneath it. Grants made before modes
-- existed are read-only, the safer reading: an organisation admin widens those that need it.
ALTER TABLE host_path_grants ADD COLUMN mode text NOT NULL DEFAULT 'ReadOnly'
    CONSTRAINT host_path_grants_mode_check CHECK (mode IN ('ReadOnly', 'ReadWrite'));
