-- A letter keeps its body once (issue 36, "a letter costs what it must").
--
-- Since 0014 a letter kept the body twice: `body`, exactly as received (what a replay sends), and
-- `payload`, the same body as jsonb (what operators read). `payload` is a function of the body
-- (shared::envelope::body_as_json: the body's JSON where jsonb can hold it, else the body as a
-- JSON string), so a letter written from now on leaves it NULL and its reader computes it from
-- `body` by that same rule: the row keeps ~40 % less heap for a storm's 230-byte body, and its
-- insert parses no jsonb. `payload` is still written where the body cannot give it back: a body
-- that held a NUL (the stored body replaces it), a letter written as received after a refusal
-- (its payload is the body as a JSON string), and every letter written before this migration.
ALTER TABLE core.dead_letters ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_payload_or_body CHECK (payload IS NOT NULL OR body IS NOT NULL) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_payload_or_body;

COMMENT ON COLUMN core.dead_letters.payload IS
    'The body as JSON where body does not give it back (NULL: read it from body, shared::envelope::body_as_json).';
