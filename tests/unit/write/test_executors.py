"""The executor seam: task order, engine choice, and conversion without Ray installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT
from zephon_store.cli.main import main
from zephon_store.write.engines import make_executor
from zephon_store.write.executors import LocalExecutor


def _slow_square(x: int) -> int:
    time.sleep(0.01 * (5 - x % 5))  # later tasks finish first
    return x * x


@pytest.mark.parametrize("workers,threads", [(1, 1), (1, 2), (3, None)])
def test_local_executor_returns_results_in_task_order(workers, threads):
    with LocalExecutor(workers, threads=threads) as ex:
        assert list(ex.map(_slow_square, range(12), name="square")) == [x * x for x in range(12)]


def test_engine_options_are_checked():
    with pytest.raises(ValueError, match="ray_address is for engine='ray'"):
        make_executor("local", ray_address="127.0.0.1:6379")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        make_executor("ray", workers=0)
    assert make_executor("ray").shared_hosts
    assert not make_executor("local").shared_hosts


def test_cli_ray_address_needs_the_ray_engine(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    code = main(["convert", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "ds"),
                 "--ray-address", "127.0.0.1:6379"])
    assert code == 2 and "--ray-address needs --engine ray" in capsys.readouterr().err


def test_without_ray_local_conversion_works_and_the_ray_engine_names_the_extra(tmp_path):
    # A None entry in sys.modules makes 'import ray' fail as if it were not installed.
    code = f"""
import sys
sys.modules["ray"] = None
import zephon_store as z
r = z.convert([{str(tmp_path / "a.jsonl")!r}], {str(tmp_path / "ds")!r}, progress=False)
assert r.num_samples == 2 and r.engine == "local", r
try:
    z.convert([{str(tmp_path / "a.jsonl")!r}], {str(tmp_path / "ds2")!r}, engine="ray",
              progress=False)
except z.MissingExtraError as exc:
    print(exc)
"""
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pip install 'zephon_store[ray]'" in r.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:  # bound then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_not_ray():
    """A TCP port that accepts connections and says nothing (not a Ray cluster)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


@pytest.mark.parametrize("kind", ["unreachable", "unresolvable", "garbage", "not_ray"])
def test_a_bad_ray_address_fails_fast_in_one_line_and_writes_nothing(tmp_path, kind):
    listener = _listening_not_ray() if kind == "not_ray" else None
    address = {"unreachable": f"127.0.0.1:{_free_port()}",
               "unresolvable": "no-such-host.invalid:6379",
               "garbage": "not an address",
               "not_ray": f"127.0.0.1:{listener.getsockname()[1] if listener else 0}"}[kind]
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    out = tmp_path / "out"
    out.mkdir()  # an existing output folder: nothing may appear in it
    argv = [sys.executable, "-m", "zephon_store.cli", "convert", str(tmp_path / "a.jsonl"),
            "-o", str(out), "--engine", "ray", "--ray-address", address]
    try:
        # Ray's own connect to such an address retried for ~14 minutes; the timeout fails
        # the test instead of hanging it.
        r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    finally:
        if listener is not None:
            listener.close()
    assert r.returncode == (2 if kind == "garbage" else 1), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("zephon convert: ") and f"--ray-address {address}: " in r.stderr
    assert list(out.iterdir()) == []


def test_the_library_refuses_a_bad_ray_address_before_writing(tmp_path):
    code = f"""
import zephon_store as z
try:
    z.convert([{str(tmp_path / "a.jsonl")!r}], {str(tmp_path / "out")!r}, engine="ray",
              ray_address="127.0.0.1:{_free_port()}")
except z.RayAddressError as exc:
    assert isinstance(exc, ConnectionError) and not exc.malformed, exc
    print(exc)
"""
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "nothing listens there" in r.stdout
    assert not (tmp_path / "out").exists()


def test_a_grpc_server_passes_the_address_check_and_a_refusing_cluster_is_one_error(
        monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    grpc = pytest.importorskip("grpc")
    ray = pytest.importorskip("ray")
    from zephon_store.errors import RayAddressError
    from zephon_store.write.ray_engine import RayExecutor, check_ray_address

    server = grpc.server(ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        # What a Ray head's GCS port answers: the check lets it through.
        assert check_ray_address(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"

        def refuse(**kwargs):
            raise RuntimeError("Version mismatch: the cluster runs Ray 2.41\nand this 2.60")

        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "init", refuse)
        with pytest.raises(RayAddressError, match="Version mismatch") as info:
            with RayExecutor(address=f"127.0.0.1:{port}"):
                pass
        assert "\n" not in str(info.value) and not info.value.malformed
    finally:
        server.stop(None)


INTERRUPTED = """
import os, signal, sys, threading, time
from zephon_store.write.executors import LocalExecutor

def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started in background
    # The kernel may hand a Ctrl-C to any thread: make it one that is not the main thread.
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})   # this thread and later ones
    with LocalExecutor(int(sys.argv[1])) as ex:
        results = ex.map(time.sleep, [60, 60])
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            list(results)
        except KeyboardInterrupt:
            print(f"interrupted {time.monotonic() - t0:.1f}", flush=True)
            os._exit(0)

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_reaches_the_main_thread_while_it_waits_on_a_task(tmp_path, workers):
    """A SIGINT delivered to another thread raised KeyboardInterrupt only when the running
    task ended (a thread pool: 60 s here); the waits now return in slices."""
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    out = subprocess.run([sys.executable, str(script), str(workers)], capture_output=True,
                         text=True, timeout=120)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("interrupted")]
    assert lines, out.stderr[-2000:]
    assert float(lines[0].split()[1]) < 30, lines   # the tasks take 60 s: not waited for
