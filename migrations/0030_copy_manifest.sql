-- The digest (BLAKE3, hex) of a whole copy's manifest as its agent reports it: what a peer
-- receiving the copy checks the manifest it is sent against. Cleared while the copy is not whole.
ALTER TABLE copies ADD COLUMN manifest text
    CONSTRAINT copies_manifest_check CHECK (manifest ~ '^[0-9a-f]{64}$');
