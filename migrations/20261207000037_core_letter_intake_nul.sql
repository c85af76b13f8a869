-- A record received into the letters' intake keeps whether its body held a NUL (issue 36, found
-- by the outside attack on 0032). The intake's text keeps no NUL (each is replaced by U+FFFD as
-- it is received), and a letter settled from it read its JSON from the replaced body: a body
-- such as {"a":"x<NUL>y"}, invalid JSON as sent, read back as the object {"a":"x\uFFFDy"} (an
-- envelope, as a valid job), where the same body written alone read back as the JSON string it
-- is. The settle now keeps that letter's payload apart, as the body as a JSON string.
ALTER TABLE core.letter_intake ADD COLUMN nul_replaced boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN core.letter_intake.nul_replaced IS
    'Whether the body held a NUL, replaced here by U+FFFD (its letter''s payload is then the body as a JSON string).';
