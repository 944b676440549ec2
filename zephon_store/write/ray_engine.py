"""The conversion's stages as Ray tasks: :class:`RayExecutor`.

``convert(..., engine="ray")`` (``zephon convert ... --engine ray [--ray-address ADDR]``)
runs the same stage functions as the local engine, each call one Ray task, so the output is
the same byte for byte for any number of workers and nodes. Tasks read inputs from their URLs
and write staged pieces and shards to the job's staging area and the output themselves; what
comes back to the driver is a small record per task (rows, hashes, byte ranges).

Crash safety comes from the converter, not from Ray: every finished task has left its
result in the staging area (beside the output when it is remote) before it returns, so a
rerun after a killed driver or node redoes only unfinished tasks. Ray adds retries: a task
whose worker process or node died is run again (``max_retries``), which is safe because every
task publishes whole files under names that depend only on their content or task index. An
error raised by the stage itself (a bad record) is not retried: it reaches the caller as the
same exception the local engine raises (file and line), not wrapped.

Task names in the Ray dashboard are ``zephon <stage>[<task index>]``: ``zephon parse[3]``
parses the fourth input file (staged as ``parsed/000003``), ``zephon write[12]`` writes shard
12.

A wrong address fails within seconds, before anything is written:
:func:`check_ray_address` resolves the host, connects, and checks that the port speaks gRPC
(as a Ray head's GCS does), where Ray's own connect retries for about 14 minutes. A task
whose worker keeps dying (``WorkerCrashedError``) raises
:class:`~zephon_store.errors.WorkerLostError` naming the task; the staged work stays, so a
rerun resumes. Ray's own log lines (its token-authentication notice on every local start,
its worker-death warnings) are shown only with ``verbose=True`` (``zephon convert
--verbose``).

Ray is an optional extra (``pip install 'zephon_store[ray]'``); importing this module does
not import it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import RayAddressError, WorkerLostError, require
from .executors import Executor

__all__ = ["RayExecutor", "check_ray_address"]

# A worker process or node that dies takes its task with it; Ray reruns such a task this
# many times before the conversion fails (the stages are idempotent).
DEFAULT_MAX_RETRIES = 3

# Seconds for each step of the address check (name lookup, connect, gRPC greeting): a live
# head answers each in milliseconds; Ray's own connect to a wrong address retries for
# minutes (20 tries of ~40 s with Ray 2.60) before it fails.
ADDRESS_CHECK_TIMEOUT = 5.0

# The Ray client server's port when ``ray://host`` names none (Ray's documented default).
RAY_CLIENT_PORT = 10001

# An HTTP/2 client preface and an empty SETTINGS frame: any gRPC server (a Ray head's GCS,
# the Ray client server) answers with a SETTINGS frame of its own, frame type 4.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4

_WHAT_TO_DO = ("give the head node's address (host:6379 by default; 'ray status' on the head "
               "prints it), or leave the address out to start a local Ray instance")


def check_ray_address(address: str, *, timeout: float = ADDRESS_CHECK_TIMEOUT) -> str:
    """Check within seconds that a Ray cluster answers at ``address``; return ``host:port``.

    ``address`` is ``host:port``, ``ray://host[:port]`` or ``auto`` (the cluster that
    ``ray start`` recorded on this host, or ``$RAY_ADDRESS``). Raises
    :class:`~zephon_store.errors.RayAddressError` for a malformed address (``malformed``
    is True), a host that does not resolve, a port where nothing listens or nothing answers,
    and one that does not speak gRPC (not a Ray head's GCS port).

    >>> check_ray_address("head:port")
    Traceback (most recent call last):
    ...
    zephon_store.errors.RayAddressError: Ray address 'head:port': cannot read it as host:port ...
    """
    host, port = _split_address(address)
    if host is None:  # "auto": what Ray itself would join
        host, port = _split_address(_auto_address(address))
    infos = _resolve(address, host, port, timeout)
    sock = _connect(address, infos, timeout)
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            _expect_grpc(address, sock, timeout)
    return f"{host}:{port}"


def _split_address(address: str) -> tuple[str | None, int]:
    text = address.strip()
    if text == "auto":
        return None, 0
    default_port = None
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "ray":
            raise RayAddressError(address, f"unknown scheme {scheme + '://'!r}; use host:port "
                                  "or ray://host:port", malformed=True)
        default_port = RAY_CLIENT_PORT
    host, sep, port_text = text.rpartition(":")
    if not sep and default_port is not None:
        host, port_text = text, str(default_port)
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):  # [::1]:6379
        host = host[1:-1]
    bad_host = not host or any(c.isspace() or c in "/?#@[]" for c in host)
    if bad_host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RayAddressError(address, "cannot read it as host:port (e.g. 10.0.0.5:6379, "
                              "ray://10.0.0.5:10001 or auto)", malformed=True)
    return host, int(port_text)


def _auto_address(address: str) -> str:
    from ray._private import services  # Ray's own lookup, so both agree on what "auto" is

    try:
        found = services.canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise RayAddressError(address, "no running Ray cluster found on this host ($RAY_ADDRESS "
                              "is unset and no 'ray start' recorded one); " + _WHAT_TO_DO) from None
    if found is None:
        raise RayAddressError(address, "no running Ray cluster found on this host; "
                              + _WHAT_TO_DO)
    return found


def _resolve(address: str, host: str, port: int, timeout: float) -> list:
    # getaddrinfo cannot be given a timeout: a daemon thread bounds the wait for a DNS server
    # that does not answer.
    result: dict = {}

    def lookup() -> None:
        try:
            result["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    t = threading.Thread(target=lookup, name="zephon-ray-address", daemon=True)
    t.start()
    t.join(timeout)
    if "infos" in result:
        return result["infos"]
    why = (f"cannot resolve host {host!r} ({result['error']})" if "error" in result
           else f"no answer from the name service for {host!r} within {timeout:g} s")
    raise RayAddressError(address, f"{why}; " + _WHAT_TO_DO)


def _connect(address: str, infos: list, timeout: float) -> socket.socket:
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    if isinstance(last, ConnectionRefusedError):
        why = "nothing listens there (connection refused)"
    elif isinstance(last, TimeoutError):
        why = f"no answer within {timeout:g} s (a host that is down, or a firewall)"
    else:
        why = f"cannot connect ({last})"
    raise RayAddressError(address, f"{why}; " + _WHAT_TO_DO)


def _expect_grpc(address: str, sock: socket.socket, timeout: float) -> None:
    data = b""
    try:
        sock.sendall(_H2_PREFACE)
        while len(data) < 4:
            chunk = sock.recv(64)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if len(data) < 4 or data[3] != _H2_SETTINGS:
        raise RayAddressError(address, "something listens there but it is not a Ray cluster "
                              "(no gRPC answer within "
                              f"{timeout:g} s); " + _WHAT_TO_DO)


class RayExecutor(Executor):
    """Run conversion stages as Ray tasks, at most ``workers`` at a time, results in order.

    ``address``: an existing cluster (``"auto"``, ``"127.0.0.1:6379"``, ``"ray://..."``);
    None starts a local Ray instance for the conversion and stops it afterwards.
    ``workers``: tasks in flight (default: the cluster's CPUs). ``cpus_per_task``: the CPUs
    Ray reserves for each task. ``verbose``: show Ray's own log lines and the workers' output
    (default: Ray's errors only). ``init_options``: extra keyword arguments for ``ray.init``.

    >>> ex = RayExecutor(workers=2, address="127.0.0.1:6379")
    >>> ex.shared_hosts, ex.workers, ex.max_retries
    (True, 2, 3)
    """

    shared_hosts = True

    def __init__(self, *, workers: int | None = None, address: str | None = None,
                 max_retries: int = DEFAULT_MAX_RETRIES, cpus_per_task: float = 1.0,
                 verbose: bool = False, init_options: dict | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if cpus_per_task <= 0:
            raise ValueError(f"cpus_per_task must be > 0, got {cpus_per_task}")
        self.address = address
        self.workers = workers or 0  # 0: the cluster's CPUs, known once connected
        self.max_retries = max_retries
        self.cpus_per_task = cpus_per_task
        self.verbose = verbose
        self.init_options = dict(init_options or {})
        self._started = False
        self._ray: Any = None

    def __enter__(self) -> RayExecutor:
        ray = require("ray", "ray")
        self._ray = ray
        if not ray.is_initialized():
            # Quiet unless asked: Ray 2.60 logs a token-authentication notice on every local
            # start and a warning per dead worker; a stage's own error still reaches the
            # caller as itself, and a lost worker as WorkerLostError.
            opts = {"logging_level": logging.INFO if self.verbose else logging.ERROR,
                    "log_to_driver": self.verbose, "include_dashboard": False,
                    **self.init_options}
            if self.address is not None:
                check_ray_address(self.address)  # seconds, where ray.init retries for minutes
                opts.pop("include_dashboard")  # a setting of the cluster, not of a client
                try:
                    ray.init(address=self.address, **opts)
                except Exception as exc:  # a version mismatch, a token the cluster refuses
                    first = (str(exc).strip().splitlines() or [""])[0][:300]
                    raise RayAddressError(self.address, f"Ray could not join the cluster there "
                                          f"({type(exc).__name__}: {first})") from exc
            else:
                ray.init(num_cpus=self.workers or None, **opts)
            self._started = True
        if not self.workers:
            cpus = ray.cluster_resources().get("CPU", 1)
            self.workers = max(1, int(cpus // self.cpus_per_task))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any], *, name: str) -> Iterator[Any]:
        """``fn(task)`` as one Ray task per task, ``workers`` in flight, yielded in task order."""
        if self._ray is None:
            raise RuntimeError("RayExecutor.map outside 'with RayExecutor(...)'")
        return self._map(fn, list(tasks), name)

    def _map(self, fn, tasks: list, name: str) -> Iterator[Any]:
        ray = self._ray
        remote = ray.remote(fn)
        pending: dict[Any, int] = {}  # ref -> task index
        done: dict[int, Any] = {}
        submitted = 0
        try:
            for want in range(len(tasks)):
                while want not in done:
                    # Keep every slot busy, also while an earlier task holds up the order.
                    while submitted < len(tasks) and len(pending) < self.workers:
                        ref = remote.options(name=f"zephon {name}[{submitted}]",
                                             max_retries=self.max_retries,
                                             num_cpus=self.cpus_per_task).remote(tasks[submitted])
                        pending[ref] = submitted
                        submitted += 1
                    # One wait costs O(in flight) (thousands of refs on a large cluster): wait
                    # for a sixteenth of them (or half a second), not for each one.
                    ready, _ = ray.wait(list(pending), num_returns=max(1, len(pending) // 16),
                                        timeout=0.5)
                    for ref in ready:
                        index = pending.pop(ref)
                        done[index] = self._outcome(ref, f"zephon {name}[{index}]")
                ok, value = done.pop(want)
                if not ok:  # raised in task order, as the local engine does
                    raise value
                yield value
        finally:
            for ref in pending:  # an error or a closed generator: stop what still runs
                ray.cancel(ref, force=True)

    def _outcome(self, ref, label: str) -> tuple[bool, Any]:
        """``(True, result)``, or ``(False, error)``: a stage's own error as itself, not
        wrapped by Ray; a worker or node lost for good as :class:`WorkerLostError`."""
        from ray.exceptions import RayError, RayTaskError

        try:
            return True, self._ray.get(ref)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            err = cause if isinstance(cause, Exception) else exc
            err.__cause__ = None
            err.__suppress_context__ = True
            return False, err
        except RayError as exc:  # WorkerCrashedError, NodeDiedError, OutOfMemoryError, ...
            reason = " ".join(str(exc).split())
            if len(reason) > 300:
                reason = reason[:300] + "..."
            err = WorkerLostError(
                f"{label}: its Ray worker died and the task failed after {self.max_retries} "
                f"retries ({type(exc).__name__}: {reason}); the finished tasks are kept: rerun "
                "the same command to resume (with --verbose to see Ray's log lines)")
            return False, err
        except Exception as exc:
            return False, exc
