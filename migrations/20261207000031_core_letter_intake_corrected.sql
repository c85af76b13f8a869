-- The letters' intake, corrected after its outside attack (issue 36, tests/tests/intake_attacks.rs).
--
-- 1. A conflict letter of a copy that never ran has 0 attempts. The DLQ ingester gives a
--    redriven copy its executions (0 for one that crashed before any was recorded); when its id
--    turns out to be another job's, committed, the letter becomes a `conflict`, and the check
--    allowed 0 only to `crashed`: the letter was refused, as parsed and as received, so its
--    record was never written (in the DLQ: reported failed on every delivery; in the intake: a
--    row no round could settle). A copy that never ran is what a conflict letter says; 0 is true.
ALTER TABLE core.dead_letters DROP CONSTRAINT dead_letters_attempts_check;
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_attempts_check
    CHECK (attempts >= 1 OR (error_kind IN ('crashed', 'conflict') AND attempts = 0)) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_attempts_check;

-- 2. A received row PostgreSQL refuses as a letter even written alone, as received (a value no
--    bound caught), is set aside with why, not retried by every round after it: settlers skip
--    it, and it stays the record (docs/operations.md: how an operator finds it).
ALTER TABLE core.letter_intake ADD COLUMN refused text;

COMMENT ON COLUMN core.letter_intake.refused IS
    'Why PostgreSQL refused this row''s letter even written alone, as received; NULL: to settle.';
