-- The previous release's statements on the events and their history, as the release before
-- the slot ring (issue 35) sent them: taken verbatim from `git show 2ca65e0^:` of
-- src/store/postgres/sql.rs (CLAIM, COMPLETE, FAIL, SWEEP) and src/store/postgres/batch.rs
-- (CLAIM_BATCH, COMPLETE_BATCH), the macros written out. Each is prepared as
-- `previous_<name>` with its parameters' types inferred, as that release's driver had them
-- inferred; tests/api/store/previous_release.rs runs them against the schema that
-- `hookgate migrate --online` leaves, which that release's nodes keep serving on.
-- When a release whose schema differs becomes the one the online steps run beside, replace
-- these texts with its statements (and the test's starting schema with its migrations).

-- claim
PREPARE previous_claim AS
WITH claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, status, attempts, last_path, fingerprint, locked_until,
         payload, content_type, request_headers, keep_payload)
    VALUES ($1, $2, 'in_progress', 1, 'first_run', $3,
            now() + $4::bigint * interval '1 millisecond',
            $5, $6, $7, $5::bytea IS NOT NULL)
ON CONFLICT (provider, event_key) DO UPDATE
    SET status = 'in_progress',
        attempts = e.attempts + 1,
        last_path = CASE e.status WHEN 'failed' THEN 'retry_after_failure'
                                  ELSE 'lease_retake' END,
        locked_until = EXCLUDED.locked_until,
        updated_at = now()
    WHERE e.mode = 'sync'
      AND (e.status = 'failed' OR (e.status = 'in_progress' AND e.locked_until <= now()))
      AND (e.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
           OR e.fingerprint = EXCLUDED.fingerprint)
    RETURNING true AS won, e.status, e.attempts, e.last_path, e.fingerprint,
              0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body
)
SELECT * FROM claimed
UNION ALL
SELECT false, status, attempts, last_path, fingerprint,
       GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint,
       result_status, result_content_type, result_body
FROM webhook_events
WHERE provider = $1 AND event_key = $2 AND NOT EXISTS (SELECT 1 FROM claimed);

-- claim_batch
PREPARE previous_claim_batch AS
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[],
                         $6::text[], $7::text[])
        AS i(provider, event_key, fingerprint, lease_ms, payload, content_type,
             request_headers)
),
claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, status, attempts, last_path, fingerprint, locked_until,
         payload, content_type, request_headers, keep_payload)
    SELECT provider, event_key, 'in_progress', 1, 'first_run', fingerprint,
           now() + lease_ms * interval '1 millisecond',
           payload, content_type, request_headers, payload IS NOT NULL
    FROM input ORDER BY provider, event_key
ON CONFLICT (provider, event_key) DO UPDATE
    SET status = 'in_progress',
        attempts = e.attempts + 1,
        last_path = CASE e.status WHEN 'failed' THEN 'retry_after_failure'
                                  ELSE 'lease_retake' END,
        locked_until = EXCLUDED.locked_until,
        updated_at = now()
    WHERE e.mode = 'sync'
      AND (e.status = 'failed' OR (e.status = 'in_progress' AND e.locked_until <= now()))
      AND (e.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
           OR e.fingerprint = EXCLUDED.fingerprint)
    RETURNING e.provider, e.event_key, true AS won, e.status, e.attempts, e.last_path,
              e.fingerprint, 0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body
)
SELECT * FROM claimed
UNION ALL
SELECT w.provider, w.event_key, false, w.status, w.attempts, w.last_path, w.fingerprint,
       GREATEST(0, extract(epoch FROM w.locked_until - now()) * 1000)::bigint,
       w.result_status, w.result_content_type, w.result_body
FROM input i
CROSS JOIN LATERAL (
    -- One primary-key probe per input key. OFFSET 0 keeps the planner from flattening this
    -- into a join, which for a large batch on a table with stale statistics it runs as a
    -- hash join over a sequential scan of the whole table.
    SELECT * FROM webhook_events w
    WHERE w.provider = i.provider AND w.event_key = i.event_key
    OFFSET 0) w
-- Won keys need no probe (NOT IN: the keys are never NULL).
WHERE (i.provider, i.event_key) NOT IN (SELECT provider, event_key FROM claimed);

-- complete
PREPARE previous_complete AS
WITH done AS (
    UPDATE webhook_events
    SET status = 'done', result_status = $4, result_content_type = $5, result_body = $6,
        locked_until = NULL, last_error = NULL, dead_reason = NULL,
        payload = CASE WHEN keep_payload THEN payload END,
        content_type = CASE WHEN keep_payload THEN content_type END,
        request_headers = CASE WHEN keep_payload THEN request_headers END, updated_at = now()
    WHERE provider = $1 AND event_key = $2 AND attempts = $3
      AND status IS NOT DISTINCT FROM 'in_progress'
    RETURNING provider, event_key, mode),
history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, error, answer)
    SELECT provider, event_key, $3, $7, $8, mode, 'done',
           now() - $9::bigint * interval '1 millisecond', now(), $4, NULL, $10
    FROM done WHERE $7::text IS NOT NULL)
SELECT count(*)::bigint AS changed FROM done;

-- complete_batch
PREPARE previous_complete_batch AS
WITH done AS (
    UPDATE webhook_events AS e
    SET status = 'done', result_status = ($4::int2[])[u.n],
        result_content_type = ($5::text[])[u.n], result_body = ($6::bytea[])[u.n],
        locked_until = NULL, last_error = NULL, dead_reason = NULL,
        payload = CASE WHEN e.keep_payload THEN e.payload END,
        content_type = CASE WHEN e.keep_payload THEN e.content_type END,
        request_headers = CASE WHEN e.keep_payload THEN e.request_headers END,
        updated_at = now()
    FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY
              AS u(provider, event_key, attempts, n)
          ORDER BY provider, event_key) AS u
    WHERE e.provider = u.provider AND e.event_key = u.event_key
      AND e.attempts = u.attempts AND e.status IS NOT DISTINCT FROM 'in_progress'
    RETURNING e.provider, e.event_key, e.mode, e.attempts, u.n),
history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, answer)
    SELECT provider, event_key, attempts, ($7::text[])[n], ($8::text[])[n], mode, 'done',
           now() - ($9::int8[])[n] * interval '1 millisecond', now(), ($4::int2[])[n],
           ($10::text[])[n]
    FROM done WHERE ($7::text[])[n] IS NOT NULL)
SELECT provider, event_key FROM done;

-- fail
PREPARE previous_fail AS
WITH failed AS (
    UPDATE webhook_events
    SET status = $4, last_error = $5, dead_reason = $6, payload = $7, content_type = $8,
        request_headers = COALESCE($9, request_headers), locked_until = NULL,
        updated_at = now(),
        next_attempt_at = CASE WHEN $10::bigint IS NULL THEN next_attempt_at
                               ELSE now() + $10::bigint * interval '1 millisecond' END,
        throttles = throttles + $11::int
    WHERE provider = $1 AND event_key = $2 AND attempts = $3
      AND status IS NOT DISTINCT FROM 'in_progress'
    RETURNING provider, event_key, mode),
history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, error, answer)
    SELECT provider, event_key, $3, $12, $13, mode, $14,
           now() - $15::bigint * interval '1 millisecond', now(), $16, $5, $17
    FROM failed WHERE $12::text IS NOT NULL)
SELECT count(*)::bigint AS changed FROM failed;

-- sweep
PREPARE previous_sweep AS
DELETE FROM webhook_events
WHERE (provider, event_key) IN (
    SELECT provider, event_key FROM webhook_events
    WHERE status = $1 AND updated_at < now() - $2::bigint * interval '1 millisecond'
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED);
