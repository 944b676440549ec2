"""Hostile mixture files: every one is one line naming the file and the key, fast.

Each file goes through ``zephon info mix.toml``, ``zephon plan --mixture`` and the loader;
none may print a traceback, compute for long, or give an error that names no file. The
slow case (a weight whose exponent makes ``Fraction`` build a number of 10**8 digits) runs
in a subprocess with a timeout, so the old behaviour fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import zephon_store as z
from zephon_store.cli.main import main
from zephon_store.errors import MixtureError


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("hostile"))
    out = {}
    for name, n in (("a", 30), ("b", 20)):
        src = os.path.join(root, f"{name}.jsonl")
        with open(src, "w") as f:
            for i in range(n):
                f.write(json.dumps({"id": i, "text": f"{name} {i}"}) + "\n")
        out[name] = os.path.join(root, name)
        z.convert([src], out[name], options=z.WriteOptions(row_group_rows=10), progress=False)
    return out


def _toml(urls, *, weight_a='"1/2"', weight_b='"1/2"', stages: str = "", extra: str = "") -> str:
    return (f"{extra}{stages}"
            f'[[sources]]\nname = "a"\nurl = "{urls["a"]}"\nweight = {weight_a}\n'
            f'[[sources]]\nname = "b"\nurl = "{urls["b"]}"\nweight = {weight_b}\n')


def _every_surface(path: str, capsys, *, key: str, info: tuple[str, ...] = ()) -> None:
    """info (with the arguments ``info``), plan --mixture and the loader each refuse
    ``path`` with one line naming the file and ``key``."""
    for argv in (["info", path, *info], ["info", path, "--json", *info],
                 ["plan", "--mixture", path, "--world-size", "1", "--global-batch", "4"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert path in lines[0] and key in lines[0] and "Traceback" not in err, (argv, err)
    from zephon_store.torch import ZephonLoader

    with pytest.raises(MixtureError) as info:
        ZephonLoader(path, topology=z.Topology(4, world_size=1, rank=0),
                     batch=z.BatchOptions(columns=["id", "text"]))
    text = str(info.value)
    assert path in text and key in text and "\n" not in text, text


def _write(tmp_path, name: str, text: str) -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_a_huge_exponent_in_a_weight_string_is_refused_at_once(urls, tmp_path, fmt) -> None:
    """``"1e-99999999"`` is 12 bytes; Fraction parses it by building 10**99999999."""
    if fmt == "toml":
        text = _toml(urls, weight_a='"1e-99999999"', weight_b="1")
    else:
        text = json.dumps({"sources": [{"name": "a", "url": urls["a"], "weight": "1e-99999999"},
                                       {"name": "b", "url": urls["b"], "weight": 1}]})
    path = _write(tmp_path, f"mix.{fmt}", text)
    loader = ("import sys\nfrom zephon_store import Topology\n"
              "from zephon_store.torch import ZephonLoader\ntry:\n"
              f"    ZephonLoader({path!r}, topology=Topology(4))\n"
              "except Exception as exc:\n    sys.exit(f'{type(exc).__name__}: {exc}')\n")
    for argv in (["-m", "zephon_store.cli", "info", path],
                 ["-m", "zephon_store.cli", "plan", "--mixture", path, "--world-size", "1",
                  "--global-batch", "4"],
                 ["-c", loader]):
        try:
            proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                                  timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv[-1][:40]} computed for over 60 s on a 12-byte weight")
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and path in lines[0] and "sources/0" in lines[0], proc.stderr
    assert lines[0].startswith("MixtureError: ")


def test_a_mixture_nested_100000_deep_is_one_line(urls, tmp_path, capsys) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    toml_path = _write(tmp_path, "deep.toml", _toml(urls) + f"storage_options = {deep}\n")
    _every_surface(toml_path, capsys, key="storage_options")
    doc = {"sources": [{"name": "a", "url": urls["a"], "weight": 1}]}
    text = json.dumps(doc)[:-1] + ', "storage_options": ' + "{\"x\": " * 100_000 + "1" \
        + "}" * 100_000 + "}"
    json_path = _write(tmp_path, "deep.json", text)
    _every_surface(json_path, capsys, key="storage_options")
    # Nested deep enough to parse, but deeper than any mixture file needs.
    opts = "{a = " * 200 + "1" + "}" * 200
    path = _write(tmp_path, "deep200.toml",
                  _toml(urls).replace('weight = "1/2"\n', f'weight = "1/2"\nstorage_options = '
                                      f"{opts}\n", 1))
    _every_surface(path, capsys, key="sources/0/storage_options")


def test_an_integer_of_5000_digits_is_one_line(urls, tmp_path, capsys) -> None:
    big = "1" * 5000
    _every_surface(_write(tmp_path, "big.toml", _toml(urls, weight_a=big)), capsys,
                   key="weight")
    # A placeholder, not a digit: the temporary paths in the urls hold digits too.
    doc = json.dumps({"sources": [{"name": "a", "url": urls["a"], "weight": "BIG"},
                                  {"name": "b", "url": urls["b"], "weight": 1}]})
    _every_surface(_write(tmp_path, "big.json", doc.replace('"BIG"', big)), capsys,
                   key="weight")


def test_a_stage_start_beyond_int64_is_one_line(urls, tmp_path, capsys) -> None:
    stages = ('[[stages]]\nname = "s0"\nstart = {samples = 0}\n'
              '[[stages]]\nname = "far"\nstart = {samples = 99999999999999999999}\n')
    path = _write(tmp_path, "far.toml", _toml(urls, stages=stages))
    _every_surface(path, capsys, key="stages/1")
    # In steps the start is fine alone, and the product with the global batch is too far.
    stages = ('[[stages]]\nname = "s0"\nstart = {samples = 0}\n'
              '[[stages]]\nname = "far"\nstart = {steps = 2305843009213693952}\n')
    path = _write(tmp_path, "far_steps.toml", _toml(urls, stages=stages))
    _every_surface(path, capsys, key="stages/1", info=("--global-batch", "4"))


def test_a_weight_below_the_resolution_names_the_file_and_source(urls, tmp_path,
                                                                 capsys) -> None:
    path = _write(tmp_path, "tiny.toml", _toml(urls, weight_a='"1e-10"',
                                               weight_b='"0.9999999999"'))
    _every_surface(path, capsys, key="'a'")


def test_a_weight_string_of_ordinary_size_still_parses(urls, tmp_path, capsys) -> None:
    """The bounds leave every sensible spelling alone."""
    path = _write(tmp_path, "ok.toml", _toml(urls, weight_a='"0.5e0"', weight_b='"5E-1"'))
    assert main(["info", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["stages"][0]["weights"] == {"a": "1/2", "b": "1/2"}


def test_a_fifo_as_a_mixture_file_is_refused_without_blocking(tmp_path) -> None:
    """A FIFO named mix.toml would block ``info``, ``plan`` and the loader until a writer
    came (the deny list and the run log already refuse one): one line, at once. Run in a
    subprocess with a timeout, so the old behaviour fails the test instead of hanging it."""
    path = str(tmp_path / "mix.toml")
    os.mkfifo(path)
    code = ("import sys\nfrom zephon_store.cli.main import main\n"
            f"sys.exit(main(['info', {path!r}]))\n")
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("zephon info blocked on a FIFO given as a mixture file")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert path in lines[0] and "regular file" in lines[0], run.stderr
    from zephon_store.format.mixture_file import load_mixture_file

    with pytest.raises(MixtureError, match="not a regular file"):
        load_mixture_file(path)
