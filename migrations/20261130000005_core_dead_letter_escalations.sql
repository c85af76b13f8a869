-- Escalation of dead letters nobody reviewed (spec open question 2). A letter still
-- pending_review after N days is escalated at step 1, after 2N days at step 2, and so on;
-- a row here records that a (letter, step) was escalated, so no step is ever paged twice.
CREATE TABLE core.dead_letter_escalations (
    letter_id    uuid        NOT NULL REFERENCES core.dead_letters (id),
    step         integer     NOT NULL CHECK (step >= 1),
    escalated_at timestamptz NOT NULL,
    PRIMARY KEY (letter_id, step)
);
