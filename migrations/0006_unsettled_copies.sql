-- The fill controller reads only copies that are not whole yet; most copies are.
CREATE INDEX copies_unsettled_idx ON copies (drive_id, machine_id) WHERE state <> 'Complete';
