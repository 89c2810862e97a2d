-- 0040: the claim that made each running attempt. A worker names each claim it sends
-- (a fresh uuid per claim statement); when the answer to a claim is lost with its
-- connection, the worker gives back the jobs of that claim, and only those, as soon as it
-- reaches the database again (`worker_release_claim`), instead of leaving them held until
-- their leases run out and spending an attempt of each.
ALTER TABLE {schema}.jobs ADD COLUMN claim_id uuid;
