"""A parse function that waits at a gate, so a test knows a convert is inside its parse phase.

``gated_parse`` opens the FIFO named by ``$ZEPHON_TEST_GATE`` for reading before it parses
the input. Opening a FIFO blocks until the other end opens it, so a test that opens it for
writing returns exactly when the convert (holding its output lock) is parsing; closing it
lets the parse go on. Module-level so spawned worker processes can import it.
"""

from __future__ import annotations

import os

from zephon_store.write.convert import _default_parse


def gated_parse(f, options, storage_options, stats):
    with open(os.environ["ZEPHON_TEST_GATE"], "rb") as gate:
        gate.read()  # until the test closes its end
    yield from _default_parse(f, options, storage_options, stats)


def open_gate_for_writing(path: str, *, timeout: float = 60.0):
    """Open the gate FIFO for writing: returns once a convert reached :func:`gated_parse`.

    If no convert gets there (it failed first), a watchdog opens the reading end itself after
    ``timeout`` so the test fails on its assertions instead of hanging.
    """
    import threading

    fds: list[int] = []
    timer = threading.Timer(timeout, lambda: fds.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK)))
    timer.start()
    try:
        return open(path, "wb")
    finally:
        timer.cancel()
