"""Convert's time per kind of work (issue 43 item 5): measured in every task, summed by the
driver, in ``ConvertResult.work_seconds`` and ``zephon convert --verbose``."""

from __future__ import annotations

import json
import threading
import time

import pytest

import zephon_store as z
from zephon_store.cli.main import main
from zephon_store.write.executors import LocalExecutor
from zephon_store.write.stage_times import WORK, StageTimes, stage


def test_a_nested_stage_is_taken_out_of_the_enclosing_one() -> None:
    t = StageTimes()
    with t.active():
        with stage("read"):
            time.sleep(0.02)
            with stage("tokenize"):
                time.sleep(0.05)
    assert t.seconds["tokenize"] >= 0.05
    assert 0.02 <= t.seconds["read"] < 0.05, t.seconds


def test_stage_charges_only_the_thread_whose_timer_is_active() -> None:
    t = StageTimes()

    def other() -> None:
        with stage("compress"):
            time.sleep(0.01)

    with t.active():
        th = threading.Thread(target=other)
        th.start()
        th.join()
    with stage("read"):   # after the block: no timer is active any more
        pass
    assert t.seconds == {}


def _inputs(tmp_path, files=2, rows=3000):
    paths = []
    for k in range(files):
        p = tmp_path / f"part{k}.jsonl"
        with open(p, "w") as f:
            for i in range(rows):
                f.write(json.dumps({"id": i, "text": f"document {k}-{i} " * 20}) + "\n")
        paths.append(str(p))
    return paths


SMALL = z.WriteOptions(target_shard_bytes=200_000, row_group_bytes=50_000)


@pytest.mark.parametrize("workers", [1, 2])
def test_every_kind_of_work_is_timed(tmp_path, workers) -> None:
    inputs = _inputs(tmp_path)
    r = z.convert(inputs, str(tmp_path / "out"), options=SMALL, workers=workers)
    assert r.num_shards > 2
    assert list(r.work_seconds) == [k for k in WORK if k in r.work_seconds]   # WORK order
    assert set(r.work_seconds) == set(WORK) - {"tokenize", "pack"}, r.work_seconds
    # Rounded to the millisecond: sizing a few thousand rows can round to 0.
    assert all(r.work_seconds[k] > 0 for k in ("read", "compress", "publish")), r.work_seconds
    # Measured in the tasks: compressing and hashing happen nowhere else.
    task_work = sum(v for k, v in r.work_seconds.items() if k != "publish")
    assert task_work <= (r.stages["parse"] + r.stages["write"]) * max(2, workers) + 0.05


def test_work_seconds_come_back_from_threads(tmp_path) -> None:
    r = z.convert(_inputs(tmp_path, files=3), str(tmp_path / "out"), options=SMALL,
                  executor=LocalExecutor(1, threads=2))
    assert r.work_seconds["compress"] > 0 and r.work_seconds["read"] > 0


def test_cli_verbose_prints_phases_and_work(tmp_path, capsys) -> None:
    inputs = _inputs(tmp_path, files=1)
    assert main(["convert", *inputs, "-o", str(tmp_path / "a")]) == 0
    assert "work," not in capsys.readouterr().out
    assert main(["convert", *inputs, "-o", str(tmp_path / "b"), "--verbose"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("time ") and "parse " in out[-2] and "publish " in out[-2], out
    assert out[-1].startswith("work, s summed over the tasks of 1 worker (local): read "), out
    assert "compress " in out[-1] and "hash " in out[-1]


def test_packing_times_tokenize_and_pack_apart_from_read(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from zephon_store.write.packing import PackingOptions, packing_convert_kwargs

    words = ["[UNK]", "<s>", "</s>", "document"] + [f"{k}-{i}" for k in range(2)
                                                    for i in range(3000)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    kw = packing_convert_kwargs(PackingOptions(tokenizer=str(tmp_path / "tokenizer.json"),
                                               seq_len=63, bos_token="<s>", eos_token="</s>"))
    r = z.convert(_inputs(tmp_path), str(tmp_path / "out"), options=SMALL, **kw)
    assert r.work_seconds["tokenize"] > 0 and r.work_seconds["pack"] > 0, r.work_seconds
    assert r.work_seconds["read"] > 0 and r.work_seconds["compress"] > 0
