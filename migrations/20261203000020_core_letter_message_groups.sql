-- Ordered queues (issue 25): a letter of a message from a FIFO queue keeps the message's group
-- (SQS MessageGroupId), so that its replay goes back into the same group, behind what the group
-- already holds, instead of jumping the order of another. NULL for a standard queue's letter.
-- Not a review column: the append-only guard keeps it as written. Additive: a version that
-- does not know the column writes and replays letters as before.
ALTER TABLE core.dead_letters ADD COLUMN message_group text;

-- What SQS takes back as a MessageGroupId (the harness keeps nothing else: shared::ids).
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_message_group_as_sqs_takes_it CHECK (
    message_group IS NULL OR message_group ~ '^[!-~]{1,128}$'
) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_message_group_as_sqs_takes_it;

COMMENT ON COLUMN core.dead_letters.message_group IS
    'The FIFO message group (SQS MessageGroupId) of the message the letter was written from; its replay carries it. NULL from a standard queue.';
