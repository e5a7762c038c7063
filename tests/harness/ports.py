"""PORT0 for a launch under test: its servers listen on PORT0+i and their workers' metrics on PORT0+100+i+16k
(worker process k).

`free_port()` vouches for one port only, and it is drawn from the kernel's ephemeral range, where any
outgoing connection of a busy suite may take PORT0+1 a moment later. A random base below that range, with
every port of its block free when drawn (free as the launcher judges it before it starts anything:
`pool_queue.proc.procs.port_taken`), leaves only two launches drawing overlapping blocks at once. Under
pytest-xdist each worker draws from its own share of the range, so launches of two workers never overlap."""

from __future__ import annotations

import os
import random

from pool_queue.proc.procs import port_taken

LOW, HIGH = 20000, 32000  # below Linux's ephemeral range (32768-60999): no client socket lands here
SERVERS, PROCESSES = 8, 4  # what the tests' launches start at most
BLOCK = 100 + 16 * PROCESSES  # PORT0 .. the last worker's metrics port, and a margin


def share() -> tuple[int, int]:
    """The bases this process may draw: the whole range, or an xdist worker's own slice of it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return LOW, HIGH - BLOCK
    span = (HIGH - LOW) // max(1, int(count))
    if span < 2 * BLOCK:  # too many workers to give each a slice: all draw from the whole range
        return LOW, HIGH - BLOCK
    low = LOW + (int(worker[2:]) % int(count)) * span
    return low, low + span - BLOCK


def port0() -> int:
    """A base whose servers' and metrics' ports are all free now."""
    low, high = share()
    while True:
        base = random.randrange(low, high)
        ports = [base + i for i in range(SERVERS)]
        ports += [base + 100 + 16 * k + i for i in range(SERVERS) for k in range(PROCESSES)]
        if not any(map(port_taken, ports)):  # the launcher's own check
            return base
