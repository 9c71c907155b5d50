-- status_event.v3: a SCHEDULED event carries the job's definition (spec_json: task, trigger,
-- arguments, limits, as JSON), so the console can show a job's definition and its next fires
-- (the status side does not read the requests topic). Events from older writers have none.
-- Read it with the job's latest SCHEDULED event that has one (queries.job_spec).
ALTER TABLE status_events ADD COLUMN IF NOT EXISTS spec_json Nullable(String) AFTER retry_delay_ms;
