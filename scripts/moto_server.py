"""moto's server (the local SQS API) with SQS's FIFO rules on message groups.

SQS delivers nothing more of a FIFO message group while a message of it is in flight: received
and still hidden. moto departs from that in two ways, each of which can deliver a group's later
message before an earlier one, and the harness's order within a group is tested through this
server, so here they follow SQS:

- moto counts a message in flight until a receive call happens to pass it after its visibility
  ran out, so when several messages of a group come back at once (a batch handed back whole, a
  crash) it can deliver the group's last message alone, before the ones ahead of it (seen: m2,
  then m0 and m1). Here a group is in flight only while one of its messages is hidden.
- moto decides which groups are in flight once per receive call, before its long poll waits,
  and again halfway through a pass over the queue when it meets a message whose visibility ran
  out, and it serves concurrent calls at once. So a call can deliver a group's later messages
  after passing over its earlier ones (hidden when the pass began, visible by the time it reached
  the later ones), or while another call has just received an earlier one. Here a FIFO receive
  is one pass at a time, the groups in flight decided once as it begins, repeated until messages
  come or the wait is over.
- moto changes the visibility of a message that is no longer in flight (its visibility ran out,
  or another consumer received it since), hiding it without holding its group, so the messages
  behind it are delivered first. SQS refuses that (MessageNotInflight), and a receipt handle
  older than the message's last receive changes nothing. Here, on FIFO queues, the same.

One race of moto's fixed: a delete rebuilds the queue's message list without the lock a send
appends under, and a receive that moves a message to the DLQ removes it from that list, also
without it; a message sent (or skipped by the rebuild's pass) meanwhile vanished from the queue,
acknowledged and never delivered (the batch soak found 7 and 9 jobs lost this way, each a
SendMessageBatch's jobs, never received: its queue trace, tests/src/soak.rs). Here every
receive pass and every delete holds the queue's lock, as a send does, so each waits for the
others; a long poll waits between passes, not holding it.

One change for speed, not for behaviour: moto answers every lookup of one queue attribute by
computing them all, the message counts included, each a pass over the queue, so a call's cost
grew with the queue's depth. Each send asks for ContentBasedDeduplication (measured: 240
messages/s into an empty queue, 26/s at 2,500 deep), and a receive asks for
MessageRetentionPeriod three times for every message it returns (measured: a receive of 10 from
a queue of 2,000 took 680 ms, so draining 2,000 took 136 s). Here one attribute is computed
alone.

Everything else is moto's own; scripts/lib.sh starts the server through this file.
"""

import sys
from collections.abc import Mapping
import threading
import time

from moto.core.utils import camelcase_to_underscores
from moto.server import main
from moto.sqs.exceptions import SQSException
from moto.sqs.models import Queue, SQSBackend


def _groups_in_flight(queue):
    return {
        message.group_id
        for message in queue._pending_messages
        if message.group_id is not None and not message.visible
    }


def _groups_held(queue):
    frozen = getattr(queue, "_groups_held_this_pass", None)
    return _groups_in_flight(queue) if frozen is None else frozen


Queue.pending_message_groups = property(_groups_held)

_change_message_visibility = SQSBackend.change_message_visibility


def change_message_visibility(self, queue_name, receipt_handle, visibility_timeout):
    queue = self.get_queue(queue_name)
    if queue.fifo_queue:
        for message in queue._messages:
            if message.had_receipt_handle(receipt_handle):
                if message in queue.pending_messages and not message.visible:
                    if message.receipt_handle != receipt_handle:
                        return  # an older receive's handle: SQS leaves the message be
                    break
                raise SQSException(
                    "MessageNotInflight", "The message referred to is not in flight."
                )
    return _change_message_visibility(self, queue_name, receipt_handle, visibility_timeout)


SQSBackend.change_message_visibility = change_message_visibility

_receive_message = SQSBackend.receive_message
_fifo_receive = threading.Lock()


def receive_message(self, queue_name, count, wait_seconds_timeout, visibility_timeout, *rest):
    queue = self.get_queue(queue_name)
    deadline = time.monotonic() + (wait_seconds_timeout or 0)
    while True:
        if queue.fifo_queue:
            with _fifo_receive, queue._messages_lock:
                queue._groups_held_this_pass = _groups_in_flight(queue)
                try:
                    result = _receive_message(self, queue_name, count, 0, visibility_timeout, *rest)
                finally:
                    queue._groups_held_this_pass = None
        else:
            with queue._messages_lock:
                result = _receive_message(self, queue_name, count, 0, visibility_timeout, *rest)
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(0.05)


SQSBackend.receive_message = receive_message

_delete_message = Queue.delete_message


def delete_message(self, receipt_handle):
    with self._messages_lock:
        return _delete_message(self, receipt_handle)


Queue.delete_message = delete_message

_all_attributes = Queue.attributes.fget


class _Attributes(Mapping):
    """A queue's attributes, each computed alone when asked for by name (the whole set only when
    iterated)."""

    def __init__(self, queue):
        self._queue = queue
        self._whole = None

    def _all(self):
        if self._whole is None:
            self._whole = _all_attributes(self._queue)
        return self._whole

    def _one(self, key):
        """(True, its value) for an attribute the queue has, computed alone, as the whole set
        computes it; (False, None) for one of the named attributes it has not (a FIFO attribute
        of a standard queue); None for the rest (Policy, RedrivePolicy), left to the whole set."""
        queue = self._queue
        kinds = [
            (queue.BASE_ATTRIBUTES, True),
            (queue.FIFO_ATTRIBUTES, queue.fifo_queue),
            (queue.KMS_ATTRIBUTES, bool(queue.kms_master_key_id)),
        ]
        for names, has in kinds:
            if key in names:
                if not has:
                    return False, None
                value = getattr(queue, camelcase_to_underscores(key))
                return True, str(value).lower() if isinstance(value, bool) else value
        return None

    def get(self, key, default=None):
        one = self._one(key)
        if one is None:
            return self._all().get(key, default)
        found, value = one
        return value if found else default

    def __getitem__(self, key):
        one = self._one(key)
        if one is None:
            return self._all()[key]
        found, value = one
        if not found:
            raise KeyError(key)
        return value

    def __contains__(self, key):
        one = self._one(key)
        return key in self._all() if one is None else one[0]

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())


Queue.attributes = property(_Attributes)

if __name__ == "__main__":
    sys.exit(main())
