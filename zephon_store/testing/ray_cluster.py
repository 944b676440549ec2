"""A real local Ray cluster for tests and benchmarks: a head node and worker nodes on 127.0.0.1.

Each node is a ``ray start`` process tree (GCS, raylet, agents, worker processes) under one
temp folder of its own, so :meth:`LocalRayCluster.stop` ends exactly the processes of this
cluster (those whose command line names the folder, and their descendants), never another
Ray instance on the host, which ``ray stop`` would. A watchdog process ends the cluster
when the process that started it dies without stopping it (killed, or a test run cut short):
``ray start`` daemonizes, so nothing else would. Token authentication is off (loopback only)
and usage statistics are not sent.

Usage sketch: ``with LocalRayCluster(node_cpus=[2, 1]) as cluster:`` then
``convert(..., engine="ray", ray_address=cluster.address)``; ``cluster.worker_pids(name)``
lists the worker processes running a task whose name starts with ``name``
(``"zephon write"``), for fault injection.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .s3_server import pick_ports

__all__ = ["LocalRayCluster", "ray_env"]


def ray_env() -> dict[str, str]:
    """The environment every process of a test cluster (nodes and drivers) runs with."""
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                RAY_DEDUP_LOGS="0")


def _procs() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line)} of every process we can read."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(d)] = (ppid, cmd)
    return out


class LocalRayCluster:
    """``len(node_cpus)`` Ray nodes on 127.0.0.1: the first is the head, each with the CPUs
    given. ``object_store_bytes`` per node keeps memory small (Ray's default is 30% of RAM).
    """

    def __init__(self, node_cpus: list[int] | tuple[int, ...] = (1, 1), *,
                 object_store_bytes: int = 100_000_000) -> None:
        if not node_cpus or any(c < 1 for c in node_cpus):
            raise ValueError(f"node_cpus must be a non-empty list of counts >= 1, got {node_cpus}")
        self.node_cpus = list(node_cpus)
        self.object_store_bytes = object_store_bytes
        self.address = ""
        self._port = 0
        self._node_ports: list[int] = []  # node manager port of each non-head node
        self._raylets: dict[int, int] = {}  # node -> its raylet's pid, once found
        self._watchdog: subprocess.Popen | None = None
        self._watch_fd = -1
        # Short: Ray puts unix sockets under it (108-character limit).
        self.temp_dir = tempfile.mkdtemp(prefix="zray-", dir="/tmp")
        self._ray = os.path.join(os.path.dirname(sys.executable), "ray")

    def _start(self, args: list[str], log: str) -> None:
        with open(os.path.join(self.temp_dir, log), "w") as fh:
            r = subprocess.run([self._ray, "start", *args, "--disable-usage-stats",
                                f"--object-store-memory={self.object_store_bytes}"],
                               env=ray_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=120)
        if r.returncode != 0:
            with open(os.path.join(self.temp_dir, log)) as fh:
                tail = fh.read()[-3000:]
            raise RuntimeError(f"ray start failed ({log}):\n{tail}")

    def start(self) -> LocalRayCluster:
        port, agent, metrics, client = pick_ports(4)
        self.address, self._port = f"127.0.0.1:{port}", port
        self._start_watchdog()
        try:
            self._start(["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                         f"--num-cpus={self.node_cpus[0]}", "--include-dashboard=false",
                         f"--dashboard-agent-listen-port={agent}",
                         f"--metrics-export-port={metrics}",
                         f"--ray-client-server-port={client}", f"--temp-dir={self.temp_dir}"],
                        "head.log")
            for k, cpus in enumerate(self.node_cpus[1:], start=1):
                agent_k, metrics_k, manager_k = pick_ports(3)
                self._node_ports.append(manager_k)
                self._start([f"--address={self.address}", "--node-ip-address=127.0.0.1",
                             f"--num-cpus={cpus}", f"--dashboard-agent-listen-port={agent_k}",
                             f"--metrics-export-port={metrics_k}",
                             f"--node-manager-port={manager_k}",
                             f"--temp-dir={self.temp_dir}"], f"node{k}.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _marks(self) -> list[str]:
        # The Ray client proxy names only the GCS address (its port is this cluster's).
        return [self.temp_dir] + ([f"--address={self.address} ", f":{self._port} "]
                                  if self._port else [])

    def _pids(self) -> dict[int, str]:
        """Every process of this cluster: those naming its temp folder, and their children."""
        return _marked(self._marks())

    def _start_watchdog(self) -> None:
        """A child that waits for EOF on a pipe only this process holds open, then ends the
        cluster: the pipe closes when this process exits, however it exits."""
        read_end, self._watch_fd = os.pipe()
        code = ("import sys; from zephon_store.testing.ray_cluster import _end_marked; "
                "sys.stdin.buffer.read(); _end_marked(sys.argv[1:])")
        self._watchdog = subprocess.Popen([sys.executable, "-c", code, *self._marks()],
                                          stdin=read_end, start_new_session=True)
        os.close(read_end)

    def worker_pids(self, task_prefix: str) -> list[int]:
        """Worker processes of this cluster now running a task named ``task_prefix...``
        (Ray sets a worker's title to ``ray::<task name>`` while it runs one)."""
        return sorted(p for p, cmd in self._pids().items()
                      if cmd.startswith(f"ray::{task_prefix}"))

    def _node_tree(self, k: int) -> dict[int, str]:
        """Non-head node ``k`` (1-based): its raylet and every process under it. The raylet
        is found once; then only its descendants are read (cheap enough to poll)."""
        raylet = self._raylets.get(k)
        if raylet is None or not _alive(raylet):
            port = self._node_ports[k - 1]
            found = [p for p, (_, cmd) in _procs().items()
                     if "raylet" in cmd and f"--node_manager_port={port} " in cmd + " "]
            if not found:
                return {}
            raylet = self._raylets[k] = found[0]
        tree, todo = {}, [raylet]
        while todo:
            p = todo.pop()
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    tree[p] = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            todo.extend(_children(p))
        return tree

    def node_running(self, k: int, task_prefix: str) -> bool:
        """True while a worker of non-head node ``k`` runs a task named ``task_prefix...``."""
        return any(cmd.startswith(f"ray::{task_prefix}") for cmd in self._node_tree(k).values())

    def kill_node(self, k: int) -> list[int]:
        """SIGKILL non-head node ``k`` (1-based): its raylet and every process under it (its
        workers and agents), as when a host dies. Returns the pids killed."""
        found = self._node_tree(k)
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return sorted(found)

    def stop(self, timeout: float = 2.0) -> None:
        """End every process of this cluster (SIGTERM, then SIGKILL) and remove its folder."""
        _end_marked(self._marks(), timeout)
        if self._watchdog is not None:
            os.close(self._watch_fd)  # the watchdog finds nothing left and exits
            self._watchdog.wait(30)
            self._watchdog = None

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def _marked(marks: list[str]) -> dict[int, str]:
    """{pid: command line} of the Ray processes naming one of ``marks``, and their children."""
    procs = _procs()
    me = os.getpid()
    found = {p for p, (_, cmd) in procs.items()
             if any(m in cmd for m in marks) and "ray" in cmd and p != me
             and "_end_marked" not in cmd}  # not the watchdog
    grew = True
    while grew:
        grew = False
        for p, (ppid, _) in procs.items():
            if ppid in found and p not in found and p != me:
                found.add(p)
                grew = True
    return {p: procs[p][1] for p in found}


def _end_marked(marks: list[str], timeout: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, the processes :func:`_marked` finds; remove the temp folder
    (``marks[0]``)."""
    pids = _marked(marks)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 2)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    shutil.rmtree(marks[0], ignore_errors=True)


def _alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
