-- 0031: a retried job starts its snoozes afresh, as it starts its attempts and its
-- interruptions (operator_retry, operator_retry_many): a job failed for snoozing too often
-- and retried by an operator may snooze again. Done where every retry passes — the only
-- way from failed or cancelled back to pending or waiting — rather than in each retry
-- function.

CREATE FUNCTION {schema}.jobfence_retry_snoozes() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.snoozes := 0;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_retry_resets_snoozes
    BEFORE UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('failed', 'cancelled') AND NEW.status IN ('pending', 'waiting')
          AND OLD.snoozes <> 0)
    EXECUTE FUNCTION {schema}.jobfence_retry_snoozes();
