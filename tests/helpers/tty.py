"""Run a command with its stderr on a pseudo-terminal, as a person's shell would.

Progress bars are shown only on a terminal; tests see what a person sees by reading the
pty's other end. The pty is given a size (a fresh one is 0 columns wide, and tqdm draws
nothing in 0 columns).
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_on_tty(argv: list[str], *, env: dict | None = None,
               timeout: float = 300) -> tuple[int, str, str]:
    """``(exit status, stdout, what the terminal showed)``: stdout is a pipe, stderr the
    pty (stdin too), so a command that checks ``sys.stderr.isatty()`` sees a terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:   # EIO: every writer of the pty has exited
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise TimeoutError(f"{argv} still ran after {timeout} s")
        out = proc.communicate(timeout=timeout)[0]
    finally:
        os.close(master)
    return proc.returncode, out.decode(), shown.decode(errors="replace")
