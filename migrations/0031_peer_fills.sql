-- Peer fills. A machine's agent serves its whole copies to peers at `data_address` (reported in
-- its heartbeats). A fill run with `fill_peer_machine_id` pulls its copy from that machine's copy,
-- checked against `fill_peer_manifest`, instead of running the drive's fill template; it goes
-- back to the template when the pull fails (controllers::fill). A fill pulls from a peer while it
-- has `fill_peer_manifest`, even once the peer is deleted (its pull then fails).
ALTER TABLE machines ADD COLUMN data_address text
    CONSTRAINT machines_data_address_check CHECK (data_address ~ '^https?://[^/?#@\s]+$' AND length(data_address) <= 255);
ALTER TABLE runs
    ADD COLUMN fill_peer_machine_id uuid REFERENCES machines (id) ON DELETE SET NULL,
    ADD COLUMN fill_peer_manifest   text CONSTRAINT runs_fill_peer_manifest_check CHECK (fill_peer_manifest ~ '^[0-9a-f]{64}$');
-- Uploads under way from each holder, counted when peers are chosen.
CREATE INDEX runs_fill_peer_idx ON runs (fill_peer_machine_id) WHERE fill_peer_machine_id IS NOT NULL;
