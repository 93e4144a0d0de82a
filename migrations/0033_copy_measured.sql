-- Whether a complete copy's bytes were measured whole, after its marker. Until they are,
-- placement counts its room by its size hint, as it does while the copy fills.
ALTER TABLE copies ADD COLUMN measured boolean NOT NULL DEFAULT true;
