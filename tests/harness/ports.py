"""PORT0 for a launch under test: its servers listen on PORT0+i and their workers' metrics on PORT0+100+i+16k
(worker process k).

`free_port()` vouches for one port only, and it is drawn from the kernel's ephemeral range, where any
outgoing connection of a busy suite may take PORT0+1 a moment later. A random base below that range, with
every port of its block free when drawn (free as the launcher judges it before it starts anything:
`pool_queue.proc.procs.port_taken`), leaves only two launches drawing overlapping blocks at once."""

from __future__ import annotations

import random

from pool_queue.proc.procs import port_taken

LOW, HIGH = 20000, 32000  # below Linux's ephemeral range (32768-60999): no client socket lands here
SERVERS, PROCESSES = 8, 4  # what the tests' launches start at most


def port0() -> int:
    """A base whose servers' and metrics' ports are all free now."""
    while True:
        base = random.randrange(LOW, HIGH - 100 - 16 * PROCESSES)
        ports = [base + i for i in range(SERVERS)]
        ports += [base + 100 + 16 * k + i for i in range(SERVERS) for k in range(PROCESSES)]
        if not any(map(port_taken, ports)):  # the launcher's own check
            return base
