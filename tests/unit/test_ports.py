"""The tests' launch ports are free as the launcher judges them (`pool_queue.proc.procs.port_taken`)."""

from __future__ import annotations

import random
import socket

from ports import port0

from pool_queue.proc.procs import port_taken


def test_port0_passes_over_a_block_a_listener_on_another_loopback_address_holds() -> None:
    """A listener on 127.0.0.2 leaves 127.0.0.1's bind free, yet a server that binds every address (vLLM,
    the simulator, Redis) cannot start there: the base the same draw would give is taken, so another comes."""
    random.seed(1234)
    base = port0()
    with socket.socket() as held:
        held.bind(("127.0.0.2", base))
        held.listen()
        assert port_taken(base)
        random.seed(1234)
        assert port0() != base


def test_a_closed_connections_time_wait_does_not_make_a_port_taken() -> None:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
        client.close()
    assert not port_taken(port)
