"""moto's server (the local SQS API) with SQS's FIFO rule on message groups.

SQS delivers nothing more of a FIFO message group while a message of it is in flight: received
and still hidden. moto counts a message in flight until a receive call happens to pass it after
its visibility ran out, so when several messages of a group come back at once (a batch handed
back whole, a crash) it can deliver the group's last message alone, before the ones ahead of it
(seen: m2, then m0 and m1). The harness's order within a group is tested through this server,
so the group counts as in flight only while one of its messages is hidden, as in SQS.
Everything else is moto's own; scripts/lib.sh starts the server through this file.
"""

import sys

from moto.server import main
from moto.sqs.models import Queue


def _groups_in_flight(queue):
    return {
        message.group_id
        for message in queue._pending_messages
        if message.group_id is not None and not message.visible
    }


Queue.pending_message_groups = property(_groups_in_flight)

if __name__ == "__main__":
    sys.exit(main())
