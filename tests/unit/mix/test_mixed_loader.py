"""Mixtures in the loader: the batches are the pure computation, resume appends a stage.

Three small local sources of different sizes (one with an extra column). The reference for
every check is computed here from the parts: ``MixtureSchedule.locate`` gives (source,
index), each source's own ``Order`` (seed derived from the mixture seed and the source
index) gives the sample; the loader must hand out exactly those samples, batch by batch,
with ``_source`` and ``_seq`` (the source's own id) beside each row's data.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon_store as z
from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions
from zephon_store.errors import MixtureError, StateMismatchError
from zephon_store.load.source import open_mixture, plan_of
from zephon_store.mix.mixed import (
    MixedDataset,
    MixedOrder,
    mean_sample_size,
    source_order_options,
)
from zephon_store.order import Order, OrderOptions
from zephon_store.order.mixture import MixtureSchedule
from zephon_store.read.dataset import open_dataset
from zephon_store.torch import ZephonLoader

SIZES = {"web": 120, "code": 37, "math": 250}
SEED = 5
B = 8


def _convert(root, name: str, n: int, extra: bool = False) -> str:
    src = os.path.join(root, f"{name}.jsonl")
    with open(src, "w") as f:
        for i in range(n):
            rec = {"id": i, "text": f"{name} {i}"}
            if extra:
                rec["lang"] = "py"
            f.write(json.dumps(rec) + "\n")
    out = os.path.join(root, name)
    z.convert([src], out, options=z.WriteOptions(row_group_rows=10, target_shard_bytes="4KiB"),
              progress=False)
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("mix"))
    return {name: _convert(root, name, n, extra=(name == "code"))
            for name, n in SIZES.items()}


def _mixture(sources, stages, *, seed=None, **extra) -> dict:
    """A mixture-file dict: ``stages`` is [(name, start_samples, {source: weight})]."""
    d = {"stages": [{"name": n, "start": {"samples": s}} for n, s, _ in stages],
         "sources": [{"name": k, "url": url,
                      "weights": {n: w.get(k, 0) for n, _, w in stages}}
                     for k, url in sources.items()], **extra}
    if seed is not None:
        d["seed"] = seed
    return d


TWO_STAGES = [("warm", 0, {"web": 0.5, "code": 0.25, "math": 0.25}),
              ("main", 40, {"web": "1/5", "code": "1/5", "math": "3/5"})]
THREE_STAGES = [*TWO_STAGES, ("anneal", 96, {"web": 0.1, "code": 0.6, "math": 0.3})]


ID_TEXT = BatchOptions(columns=["id", "text"], with_seq=True)


def _loader(mix, *, world_size=1, rank=0, global_batch=B, steps=None, stop=None,
            batch=ID_TEXT) -> ZephonLoader:
    """``steps``: ``stop=StopOptions(max_steps=steps)``, for a ``stop`` not given."""
    return ZephonLoader(mix, topology=Topology(global_batch, world_size, rank), seed=SEED,
                        stop=stop or StopOptions(max_steps=steps), batch=batch)


def _pure(sources, schedule: MixtureSchedule, positions: np.ndarray) -> list[tuple[int, int]]:
    """(source, source's own id) at each position, from the schedule and the sources' orders."""
    names = list(sources)
    src, idx = schedule.locate(positions)
    orders = [Order(open_dataset(sources[n]).manifest.rg_rows,
                    source_order_options(OrderOptions(seed=SEED), k))
              for k, n in enumerate(names)]
    return [(int(k), int(orders[k].sample_at(np.array([i]))[0])) for k, i in zip(src, idx)]


def _pairs(batch) -> list[tuple[int, int]]:
    return list(zip(batch["_source"].tolist(), batch["_seq"].tolist()))


def test_batches_are_the_pure_computation_on_every_rank(sources) -> None:
    mix = _mixture(sources, TWO_STAGES)
    loaders = [_loader(mix, world_size=2, rank=r, steps=12) for r in range(2)]
    schedule = loaders[0].dataset.schedule
    expected = _pure(sources, schedule, np.arange(12 * B))
    names = list(sources)
    for step, (b0, b1) in enumerate(zip(*loaders)):
        got = _pairs(b0) + _pairs(b1)
        assert got == expected[step * B:(step + 1) * B], step
        for batch in (b0, b1):
            # The row's data is the source's own sample (text "<source> <id>").
            assert batch["text"] == [f"{names[k]} {i}" for k, i in _pairs(batch)]
            assert batch["id"].tolist() == batch["_seq"].tolist()
    counts = Counter(k for k, _ in expected[:40])
    assert counts == {0: 20, 1: 10, 2: 10}   # exact proportions over the first stage


def test_mixture_file_path_and_worker_processes(sources, tmp_path) -> None:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(_mixture(sources, TWO_STAGES, seed=SEED)))
    ref = [_pairs(b) for b in _loader(_mixture(sources, TWO_STAGES), steps=6)]
    # The file's seed applies when the loader is given none.
    loader = ZephonLoader(str(path), topology=Topology(B, world_size=1, rank=0),
                          stop=StopOptions(max_steps=6), batch=ID_TEXT,
                          workers=WorkerOptions(num_workers=2))
    assert loader.order.seed == SEED
    assert [_pairs(b) for b in loader] == ref


def test_resume_with_an_appended_stage_continues_every_source(sources) -> None:
    """Run with two stages, checkpoint at cursor 96, resume with a third stage at 96 on
    another world size and global batch: the whole stream equals the uninterrupted run with
    the three-stage schedule, and no source sample repeats within its epoch."""
    first = _loader(_mixture(sources, TWO_STAGES), steps=12)
    stream = [p for b in first for p in _pairs(b)]
    state = json.loads(json.dumps(first.state_dict()))     # plain JSON
    assert state["version"] == 2 and isinstance(state["mixture"], str)
    assert state["cursor"] == 96

    three = _mixture(sources, THREE_STAGES)
    resumed = [_loader(three, world_size=3, rank=r, steps=10, global_batch=12)
               for r in range(3)]
    for loader in resumed:
        loader.load_state_dict(state)
    for batches in zip(*resumed):
        stream += [p for b in batches for p in _pairs(b)]
    assert len(stream) == 96 + 120

    whole = [p for b in _loader(three, steps=27) for p in _pairs(b)]
    assert stream == whole
    final = MixtureSchedule.from_dict(json.loads(resumed[0].state_dict()["mixture"])["schedule"])
    assert stream == _pure(sources, final, np.arange(216))
    assert [s for s, _ in final.stages] == [0, 40, 96]
    # Each source's samples are its own order's first ones, each once per source epoch.
    for k, n in enumerate(SIZES.values()):
        ids = [i for s, i in stream if s == k]
        for e in range(0, len(ids), n):
            chunk = ids[e:e + n]
            assert len(set(chunk)) == len(chunk)
    # From position 96 on the anneal weights apply: code (37 samples) now cycles epochs.
    assert Counter(k for k, _ in stream[96:]) == {0: 12, 1: 72, 2: 36}


def test_state_carries_sources_and_consumed_counts(sources) -> None:
    loader = _loader(_mixture(sources, TWO_STAGES), steps=7)
    for _ in loader:
        pass
    mix = json.loads(loader.state_dict()["mixture"])
    assert [s["name"] for s in mix["sources"]] == list(SIZES)
    assert [s["num_samples"] for s in mix["sources"]] == list(SIZES.values())
    assert all(s["dataset_id"].startswith("xxh3:") for s in mix["sources"])
    assert mix["schedule"]["stages"][1]["consumed"] == [20, 10, 10]


def _ran(sources, stages=TWO_STAGES, steps=12) -> dict:
    loader = _loader(_mixture(sources, stages), steps=steps)
    for _ in loader:
        pass
    return loader.state_dict()


def test_bad_inputs_fail_before_the_first_batch(sources, tmp_path) -> None:
    bad = dict(sources, code=str(tmp_path / "nowhere"))
    with pytest.raises(MixtureError, match="'code'.*cannot be opened"):
        _loader(_mixture(bad, TWO_STAGES))
    with pytest.raises(MixtureError, match="sum"):
        _loader(_mixture(sources, [("all", 0, {"web": 0.5, "code": 0.2, "math": 0.2})]))
    with pytest.raises(MixtureError):
        _loader(_mixture(sources, [("all", 0, {"web": 1.2, "code": -0.2, "math": 0})]))
    # A selected column one source lacks.
    with pytest.raises(ValueError, match="'web'.*no column 'lang'"):
        _loader(_mixture(sources, TWO_STAGES),
                batch=BatchOptions(columns=["id", "lang"], with_seq=True))
    # Without columns, the first source's are read; every source must hold them.
    reordered = {"code": sources["code"], "web": sources["web"], "math": sources["math"]}
    with pytest.raises(ValueError, match="has no column 'lang'"):
        _loader(_mixture(reordered, TWO_STAGES), batch=BatchOptions(with_seq=True))


def test_bad_resumes_fail_before_the_first_batch(sources, tmp_path) -> None:
    state = _ran(sources)           # cursor 96, stages at 0 and 40
    # A stage boundary in the past (the checkpoint has no stage at 64).
    past = [*TWO_STAGES, ("late", 64, {"web": 1})]
    with pytest.raises(StateMismatchError, match="starts at 64, before the checkpoint's cursor"):
        _loader(_mixture(sources, past)).load_state_dict(state)
    # A stage already consumed, changed.
    changed = [TWO_STAGES[0], ("main", 40, {"web": 0.5, "code": 0.25, "math": 0.25})]
    with pytest.raises(StateMismatchError, match="stages that began before the cursor"):
        _loader(_mixture(sources, changed)).load_state_dict(state)
    # A source whose data changed since the checkpoint.
    other = dict(sources, math=_convert(str(tmp_path), "math", 251))
    with pytest.raises(StateMismatchError, match="'math'.*its data changed"):
        _loader(_mixture(other, TWO_STAGES)).load_state_dict(state)
    # A source left out of the mixture.
    fewer = {k: v for k, v in sources.items() if k != "code"}
    with pytest.raises(StateMismatchError, match="'code'.*is missing"):
        _loader(_mixture(fewer, [(n, s, {k: v for k, v in w.items() if k != "code"})
                                 for n, s, w in
                                 [("all", 0, {"web": 0.5, "math": 0.5})]])).load_state_dict(state)
    # A single dataset's checkpoint into a mixture loader, and the other way round.
    single = ZephonLoader(sources["web"], topology=Topology(B, world_size=1, rank=0),
                          seed=SEED)
    with pytest.raises(StateMismatchError, match="for dataset .* but the loader reads a mixture"):
        _loader(_mixture(sources, TWO_STAGES)).load_state_dict(single.state_dict())
    with pytest.raises(StateMismatchError, match="for a mixture, but the loader reads dataset"):
        single.load_state_dict(state)
    # Nothing was consumed by any failed load: the good resume still works.
    ok = _loader(_mixture(sources, TWO_STAGES), steps=1)
    ok.load_state_dict(state)
    assert ok.state_dict()["cursor"] == 96 and len([b for b in ok]) == 1


def test_adding_a_source_at_resume(sources, tmp_path) -> None:
    state = _ran({k: v for k, v in sources.items() if k != "math"},
                 [("all", 0, {"web": 0.5, "code": 0.5})], steps=4)
    grown = [("all", 0, {"web": 0.5, "code": 0.5}),
             ("more", 32, {"web": 0.25, "code": 0.25, "math": 0.5})]
    loader = _loader(_mixture(sources, grown), steps=4)
    loader.load_state_dict(state)
    pairs = [p for b in loader for p in _pairs(b)]
    assert Counter(k for k, _ in pairs) == {0: 8, 1: 8, 2: 16}
    # web and code continue where they stopped (16 each consumed before position 32).
    schedule = loader.dataset.schedule
    assert schedule.consumed(32).tolist() == [16, 16, 0]


def test_python_structure_and_token_weights(sources) -> None:
    ds = [open_dataset(u) for u in sources.values()]
    schedule = MixtureSchedule([(0, [0.5, 0.25, 0.25])], names=list(sources))
    mix = MixedDataset(ds, schedule, names=list(sources), columns=["id", "text"])
    with pytest.raises(MixtureError, match="one weight per source"):
        MixedDataset(ds[:2], schedule, names=list(sources)[:2])
    order = MixedOrder(mix, OrderOptions(seed=SEED))
    got = [p for b in _loader(mix, steps=2) for p in _pairs(b)]
    src, local = order.locate(np.arange(2 * B))
    assert got == list(zip(src.tolist(), local.tolist()))
    # Byte weights use the stored bytes per sample of each source's manifest.
    assert mean_sample_size(ds[0], "bytes") == pytest.approx(
        ds[0].manifest.rg_length.sum() / ds[0].num_samples)
    with pytest.raises(MixtureError, match="not packed"):
        mean_sample_size(ds[0], "tokens", name="web")
    by_bytes = open_mixture(_mixture(sources, [("all", 0, {"web": 0.5, "code": 0.5})],
                                     weight_unit="bytes"), columns=["id", "text"])
    w = [float(x) for x in by_bytes.schedule.stages[0][1]]
    sizes = [mean_sample_size(d, "bytes") for d in ds[:2]]
    assert w[0] / w[1] == pytest.approx(sizes[1] / sizes[0])


def test_stage_starts_in_steps_keep_their_sample_position_when_the_batch_changes(
        sources) -> None:
    """A stage begun at step 5 of global batch 8 (sample 40) stays at sample 40 after a
    resume at global batch 12, where step 5 would be sample 60."""
    in_steps = _mixture(sources, TWO_STAGES)
    in_steps["stages"][1]["start"] = {"steps": 5}
    first = _loader(in_steps, steps=7)
    stream = [p for b in first for p in _pairs(b)]
    state = first.state_dict()
    resumed = _loader(in_steps, steps=3, global_batch=12)
    resumed.load_state_dict(state)
    stream += [p for b in resumed for p in _pairs(b)]
    assert [s for s, _ in resumed.dataset.schedule.stages] == [0, 40]
    whole = [p for b in _loader(_mixture(sources, TWO_STAGES), steps=23) for p in _pairs(b)]
    assert stream == whole[:len(stream)] and len(stream) == 92


def test_cli_info_and_plan_describe_the_mixture(sources, tmp_path, capsys) -> None:
    from zephon_store.cli.main import main

    doc = _mixture(sources, TWO_STAGES, seed=SEED, exhaustion="renormalize")
    doc["sources"][1]["max_epochs"] = 1            # code: 37 samples, then it runs out
    doc["stages"][1]["start"] = {"steps": 5}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(doc))
    assert main(["info", str(path), "--json", "--global-batch", str(B)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in info["sources"]] == list(SIZES)
    assert [s["num_samples"] for s in info["sources"]] == list(SIZES.values())
    assert [st["start_sample"] for st in info["stages"]] == [0, 40]
    assert info["stages"][1]["weights"] == {"web": "1/5", "code": "1/5", "math": "3/5"}

    assert main(["plan", "--mixture", str(path), "--world-size", "2", "--global-batch",
                 str(B), "--simulate-steps", "30", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    warm, main_stage, after = plan["stages"]
    assert (warm["start"], warm["stop"], main_stage["start"]) == (0, 40, 40)
    assert warm["proportions"] == {"web": 0.5, "code": 0.25, "math": 0.25}
    # code's one epoch (37 samples) ends inside "main"; the rest is renormalised.
    where = plan["runs_out"]["code"]
    assert where["step"] == where["position"] // B and after["derived"]
    assert after["start"] == where["position"] and after["weights"]["code"] == 0
    assert main_stage["epochs_consumed"]["code"] == 1.0
    loader = ZephonLoader(str(path), topology=Topology(B, world_size=1, rank=0),
                          stop=StopOptions(max_steps=2), batch=ID_TEXT)
    first = [[list(SIZES)[k], i] for b in loader for k, i in _pairs(b)]
    assert [p for r in plan["steps"][0]["ranks"] for p in r] == first[:B]
    assert plan["read_amplification"] > 0

    assert main(["plan", "--mixture", str(path), sources["web"], "--world-size", "1",
                 "--global-batch", "8"]) == 2


def test_a_capped_source_ends_the_mixture_after_the_last_full_step(sources) -> None:
    from zephon_store.errors import SourceExhaustedError

    doc = _mixture(sources, [("all", 0, {"web": 0.5, "code": 0.5})])
    doc["sources"][1]["max_epochs"] = 1          # code: 37 samples, then the mixture ends
    loader = _loader(doc)      # endless: the mixture's end ends its loop too
    end = loader.plan.end
    assert end is not None and loader.dataset.schedule.consumed(end).tolist()[1] == 37
    got = [p for batch in loader for p in _pairs(batch)]
    assert len(got) == (end // B) * B and loader.state_dict()["cursor"] == (end // B) * B
    # A position at or past the end has no sample: the order says so, naming the source.
    with pytest.raises(SourceExhaustedError, match="'code' runs out"):
        loader.dataset.schedule.locate(np.array([end]))
    assert got == _pure(sources, loader.dataset.schedule, np.arange(len(got)))
    # renormalize: the other sources go on.
    doc["exhaustion"] = "renormalize"
    pairs = [p for b in _loader(doc, steps=12) for p in _pairs(b)]
    assert Counter(k for k, _ in pairs)[1] == 37 and len(pairs) == 96


@settings(max_examples=40, deadline=None)
@given(cursor=st.integers(1, 2000), gap=st.integers(0, 500), n=st.integers(1, 600),
       w=st.lists(st.integers(0, 10), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
       far=st.integers(0, 10**12))
def test_resume_appending_at_a_random_cursor_neither_repeats_nor_skips(
        sources, cursor, gap, n, w, far) -> None:
    """The mixed order over the real sources, resumed at ``cursor`` (plus ``far``) with a
    stage appended ``gap`` later: every source's stream indices run 0, 1, 2, ... without a
    repeat or a hole across the resume, and each position's id is that source's own order."""
    names = list(sources)
    ds = [open_dataset(sources[k]) for k in names]
    cursor += far
    base = MixtureSchedule([(0, [0.5, 0.25, 0.25]), (700, ["1/3", "1/3", "1/3"])], names=names)
    saved = MixedDataset(ds, base, names=names, columns=["id", "text"])
    weights = [f"{x}/{sum(w)}" for x in w]
    stages = [*base.stages, (max(base.stages[-1][0] + 1, cursor + gap), weights)]
    wanted = MixedDataset(ds, MixtureSchedule(stages, names=names), names=names,
                          columns=["id", "text"])
    resumed = plan_of(wanted).resumed(plan_of(saved).state_entry(), cursor).source
    before = np.arange(max(0, cursor - 300), cursor)
    after = np.arange(cursor, cursor + n)
    k0, i0 = saved.schedule.locate(before)
    k1, i1 = resumed.schedule.locate(after)
    assert (resumed.schedule.locate(before)[1] == i0).all()     # the past is unchanged
    start = saved.schedule.consumed(int(before[0])) if before.size else np.zeros(3, np.int64)
    ks, idx = np.concatenate([k0, k1]), np.concatenate([i0, i1])
    for k in range(3):
        mine = idx[ks == k]
        assert mine.tolist() == list(range(int(start[k]), int(start[k]) + mine.size))
    order = MixedOrder(resumed, OrderOptions(seed=SEED))
    src, local = resumed.split_ids(order.sample_at(after))
    assert (src == k1).all()
    for k in range(3):
        sel = k1 == k
        expect = order.source_orders[k].sample_at(i1[sel])
        assert (local[sel] == expect).all()


def test_a_second_load_starts_from_the_configured_schedule(sources) -> None:
    loader = _loader(_mixture(sources, THREE_STAGES), steps=2)
    early, late = _ran(sources, steps=3), _ran(sources, steps=12)   # cursors 24 and 96
    loader.load_state_dict(late)
    loader.load_state_dict(early)     # the last load wins, from the file's stages
    assert [s for s, _ in loader.dataset.schedule.stages] == [0, 40, 96]
    assert loader.dataset.schedule == loader.dataset.config_schedule
    whole = [p for b in _loader(_mixture(sources, THREE_STAGES), steps=5) for p in _pairs(b)]
    assert [p for b in loader for p in _pairs(b)] == whole[24:40]


def _resume(mix, state, *, steps: int, global_batch: int = B, world_size: int = 1):
    """Resume ``state`` on every rank of ``world_size`` for ``steps`` steps: (the pairs of
    the whole step, in rank order, and rank 0's state after them)."""
    loaders = [_loader(mix, world_size=world_size, rank=r, steps=steps,
                       global_batch=global_batch) for r in range(world_size)]
    for loader in loaders:
        template = loader.state_dict()    # what DCP loads into, in place, before the resume
        assert set(template) == set(state)
        loader.load_state_dict(json.loads(json.dumps(state)))
    stream = [p for batches in zip(*loaders) for b in batches for p in _pairs(b)]
    return stream, loaders[0].state_dict()


def test_a_source_added_by_an_appended_stage_survives_every_later_resume(sources) -> None:
    """docs/mixtures.md "Adding a source": the run starts with web and code, a resume adds
    math in a new stage; every later resume from the same file continues (the new source's
    epoch size is recorded, not None), and the stream is the uninterrupted run's."""
    two = {k: v for k, v in sources.items() if k != "math"}
    first = _loader(_mixture(two, [("all", 0, {"web": 0.5, "code": 0.5})]), steps=4)
    stream = [p for b in first for p in _pairs(b)]
    state = first.state_dict()
    grown = _mixture(sources, [("all", 0, {"web": 0.5, "code": 0.5}),
                               ("more", 32, {"web": 0.25, "code": 0.25, "math": 0.5})])
    for steps, batch, world in ((3, 8, 1), (2, 12, 3), (4, 4, 2), (1, 8, 1), (2, 16, 2)):
        more, state = _resume(grown, state, steps=steps, global_batch=batch, world_size=world)
        stream += more
        saved = json.loads(state["mixture"])["schedule"]["sources"]
        assert [s["epoch_size"] for s in saved] == list(SIZES.values())
    assert len(stream) == 32 + 24 + 24 + 16 + 8 + 32
    whole = [p for b in _loader(grown, steps=len(stream) // B) for p in _pairs(b)]
    assert stream == whole
    # A checkpoint written before the fix recorded None for the added source: it resumes.
    old = json.loads(state["mixture"])
    old["schedule"]["sources"][2]["epoch_size"] = None
    more, _ = _resume(grown, {**state, "mixture": json.dumps(old)}, steps=2)
    assert more == [p for b in _loader(grown, steps=len(stream) // B + 2) for p in _pairs(b)][
        len(stream):]


def test_stages_in_steps_resume_with_any_global_batch_any_number_of_times(sources) -> None:
    """A stage given in steps begins at that step of the run, whatever global batch the run
    had before; once begun it keeps its sample. The run: global batch 8 for 3 steps, then a
    stage 'late' at step 7 is appended and the run resumes at 4, then at 2 (where the file
    alone would put 'late' at sample 14, before 's1' at 16), then at 16. The stream equals
    one uninterrupted run over the stages in samples where they began: 0, 16, 40."""
    base = [("s0", 0, {"web": 0.5, "code": 0.25, "math": 0.25}),
            ("s1", 16, {"web": "1/5", "code": "1/5", "math": "3/5"})]
    late = ("late", 40, {"web": 0.1, "code": 0.6, "math": 0.3})
    first = _loader(_mixture(sources, base), steps=3)
    stream = [p for b in first for p in _pairs(b)]
    state = first.state_dict()
    in_steps = _mixture(sources, [*base, late])
    in_steps["stages"][2]["start"] = {"steps": 7}
    more, state = _resume(in_steps, state, steps=5, global_batch=4)     # steps 3..7
    stream += more
    assert (state["step"], state["cursor"]) == (8, 44)
    assert [st["start"] for st in json.loads(state["mixture"])["schedule"]["stages"]] == [
        0, 16, 40]   # step 7 began at sample 24 + (7 - 3) * 4
    for batch, steps in ((2, 3), (2, 2), (16, 3), (4, 1)):
        more, state = _resume(in_steps, state, steps=steps, global_batch=batch,
                              world_size=2)
        stream += more
    assert len(stream) == 44 + 6 + 4 + 48 + 4
    whole = [p for b in _loader(_mixture(sources, [*base, late]), steps=53, global_batch=2)
             for p in _pairs(b)]
    assert stream == whole
    # Without a checkpoint that began 'late', the file cannot be read at global batch 2.
    loader = _loader(in_steps, global_batch=2, steps=1)
    with pytest.raises(MixtureError, match=r"stages/2 \('late'\) starts at sample 14"):
        next(iter(loader))


def test_a_bounded_loader_over_a_capped_mixture_ends_cleanly(sources, caplog) -> None:
    """exhaustion "error": the mixture ends where code runs out (its 37 samples); a loader
    bounded past that end (epochs=1, or max_steps) hands out every full step before it,
    then its loop ends (no SourceExhaustedError); its one warning names that end; with
    drop_last=False the last step is the short one up to the end."""
    doc = _mixture(sources, [("all", 0, {"web": 0.5, "code": 0.5})])
    doc["sources"][1]["max_epochs"] = 1
    end = _loader(doc).plan.end
    assert end is not None and end % B and end < sum(SIZES.values())
    for kw in ({"stop": StopOptions(epochs=1)}, {"steps": 100}):
        loader = _loader(doc, **kw)
        caplog.clear()
        with caplog.at_level("WARNING", logger="zephon_store"):
            got = [p for b in loader for p in _pairs(b)]
        assert len(got) == (end // B) * B and loader.state_dict()["cursor"] == len(got)
        assert got == _pure(sources, loader.dataset.schedule, np.arange(len(got)))
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and f"position {end}" in warned[0], warned
        assert "'code'" in warned[0] and "max_epochs" in warned[0], warned
        assert [p for b in loader for p in _pairs(b)] == []     # at the end, it stays there
    short = _loader(doc, stop=StopOptions(epochs=1, drop_last=False))
    got = [p for b in short for p in _pairs(b)]
    assert len(got) == end and short.state_dict()["cursor"] == end
    assert got == _pure(sources, short.dataset.schedule, np.arange(end))


def test_plan_describes_a_capped_mixture_that_ends(sources, tmp_path, capsys) -> None:
    from zephon_store.cli.main import main

    doc = _mixture(sources, [("all", 0, {"web": 0.5, "code": 0.5})], seed=SEED)
    doc["sources"][1]["max_epochs"] = 1
    path = tmp_path / "capped.json"
    path.write_text(json.dumps(doc))
    end = _loader(doc).plan.end
    argv = ["plan", "--mixture", str(path), "--world-size", "2", "--global-batch", str(B),
            "--steps", f"0:{end // B + 3}"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["end"] == end and plan["runs_out"]["code"]["position"] == end
    assert plan["last_step"] == end // B - 1
    # Steps the loader reads, and no step past the end.
    assert [s["step"] for s in plan["steps"]] == list(range(end // B))
    loader = _loader(doc, stop=StopOptions(epochs=1))
    got = [[list(SIZES)[k], i] for b in loader for k, i in _pairs(b)]
    assert [p for s in plan["steps"] for r in s["ranks"] for p in r] == got
    assert plan["simulated_steps"] == end // B
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"the mixture ends at sample {end}" in text and "'code' runs out" in text


def test_info_json_always_gives_the_mixture_id(sources, tmp_path, capsys) -> None:
    """``zephon info mix.toml --json`` holds ``mixture_id``: the loader's ``dataset_id`` for
    the file; with stage starts in steps it depends on the global batch, and without
    ``--global-batch`` the output says so instead of leaving the key out."""
    from zephon_store.cli.main import main

    path = tmp_path / "samples.json"
    path.write_text(json.dumps(_mixture(sources, TWO_STAGES, seed=SEED)))
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    loader = ZephonLoader(str(path), topology=Topology(B, world_size=1, rank=0))
    assert info["mixture_id"] == loader.dataset_id and "mixture_id_note" not in info

    doc = _mixture(sources, TWO_STAGES, seed=SEED)
    doc["stages"][1]["start"] = {"steps": 5}
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(doc))
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mixture_id"] is None and "--global-batch" in info["mixture_id_note"]
    assert main(["info", str(path)]) == 0
    assert "mixture_id depends on the global batch" in capsys.readouterr().out
    for batch in (B, 12):
        assert main(["info", str(path), "--json", "--global-batch", str(batch)]) == 0
        info = json.loads(capsys.readouterr().out)
        loader = ZephonLoader(str(path), topology=Topology(batch, world_size=1, rank=0))
        assert info["mixture_id"] == loader.dataset_id
