"""What the tests' single-binary servers share (fake-gcs-server, Azurite): a free loopback
port, a child that dies with its parent, a readiness poll, a clean stop.

>>> LoopbackServer(["true"]).port
0
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .s3_server import _die_with_parent, pick_ports


class LoopbackServer:
    """A server process: ``command(port)`` gives its argv once a free port is picked;
    ``ready()`` (an ``OSError`` until it answers) is polled after the start."""

    name = "server"

    def __init__(self, binary: Any, *, startup_timeout: float = 30.0) -> None:
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    def command(self, port: int) -> list[str]:
        """The server's argv on ``port``."""
        raise NotImplementedError

    def ready(self) -> None:
        """Return when the server answers; raise ``OSError`` before."""
        raise NotImplementedError

    def start(self) -> LoopbackServer:
        """Start the process in a fresh temp folder and wait until :meth:`ready`."""
        if not self.binary:
            raise RuntimeError(f"{self.name} not found (the test extra and 'make test' "
                               "install it)")
        self.port = pick_ports(1)[0]
        self._dir = tempfile.TemporaryDirectory(prefix=f"zephon-{self.name}-")
        self.proc = subprocess.Popen(self.command(self.port), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=self._dir.name,
                                     preexec_fn=_die_with_parent)
        _poll(self.ready, self.proc, time.monotonic() + self.startup_timeout, self.stop,
              self.name)
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; remove the temp folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._dir is not None:
            with contextlib.suppress(OSError):
                self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _poll(ready: Callable[[], None], proc: subprocess.Popen, deadline: float,
          stop: Callable[[], None], name: str) -> None:
    while True:
        try:
            ready()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.05)
