-- What an organisation admin lets a machine's agent send to peers and receive from them, in
-- bytes a second; NULL for no limit but the agent's own flags. Heartbeats bring them to the
-- agent, so a change is announced like the data location's.
ALTER TABLE machines
    ADD COLUMN upload_bytes_per_second bigint CHECK (upload_bytes_per_second > 0),
    ADD COLUMN download_bytes_per_second bigint CHECK (download_bytes_per_second > 0);

DROP TRIGGER machines_report_changed ON machines;
CREATE TRIGGER machines_report_changed
    AFTER UPDATE OF state, data_path, data_limit_bytes, upload_bytes_per_second, download_bytes_per_second
    ON machines
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.data_path IS DISTINCT FROM NEW.data_path
                       OR OLD.data_limit_bytes IS DISTINCT FROM NEW.data_limit_bytes
                       OR OLD.upload_bytes_per_second IS DISTINCT FROM NEW.upload_bytes_per_second
                       OR OLD.download_bytes_per_second IS DISTINCT FROM NEW.download_bytes_per_second)
    EXECUTE FUNCTION astraeus_machine_report_changed();
