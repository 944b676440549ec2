"""The Source contract (issue 30 item 1, narrowed by issue 40): a Dataset and a mixture are
both read as a Source, one normaliser turns every accepted spelling into one and gives the
plan a run reads it by, and nothing else asks which it holds.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

import zephon_store as z
from tests.helpers import ROOT
from zephon_store.errors import MixtureError
from zephon_store.format.mixture_file import MixtureSpec
from zephon_store.load.plan import DatasetPlan, MixedPlan, Plan
from zephon_store.load.source import Source, open_source, plan_of
from zephon_store.mix.mixed import MixedDataset
from zephon_store.order import OrderOptions
from zephon_store.order.topology import Topology
from zephon_store.read.dataset import Dataset, open_dataset

PKG = pathlib.Path(ROOT) / "zephon_store"
ASKS = re.compile(r"is_mixture|isinstance\([^)]*MixedDataset")
# What makes a mixture from a spelling (mix/mixed.py's parts): named, even imported under
# another name, anywhere but the normaliser and the module that defines them.
BUILDS = re.compile(r"\b(build_mixture|open_sources|mixture_spec|open_mixture_spec)\b"
                    r"|\bMixedDataset\(")


def _convert(root, name: str, n: int) -> str:
    src = os.path.join(root, f"{name}.jsonl")
    with open(src, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": f"{name} {i}"}) + "\n")
    out = os.path.join(root, name)
    z.convert([src], out, options=z.WriteOptions(row_group_rows=10), progress=False)
    return out


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("src"))
    return {"a": _convert(root, "a", 40), "b": _convert(root, "b", 25)}


def _mix_dict(urls, seed=None) -> dict:
    d = {"stages": [{"name": "s", "start": {"samples": 0}}],
         "sources": [{"name": k, "url": u, "weights": {"s": 0.5}} for k, u in urls.items()]}
    if seed is not None:
        d["seed"] = seed
    return d


def test_every_spelling_opens_as_a_source(urls, tmp_path) -> None:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(_mix_dict(urls)))
    ds = open_dataset(urls["a"])
    mix = open_source(_mix_dict(urls))
    for spelling, kind in [(urls["a"], Dataset), (ds, Dataset), (str(path), MixedDataset),
                           (_mix_dict(urls), MixedDataset),
                           (MixtureSpec.from_dict(_mix_dict(urls)), MixedDataset),
                           (mix, MixedDataset)]:
        src = open_source(spelling)
        assert isinstance(src, Source) and isinstance(src, kind)
    assert open_source(ds) is ds and open_source(mix) is mix
    assert isinstance(plan_of(ds), DatasetPlan) and isinstance(plan_of(mix), MixedPlan)
    assert all(isinstance(plan_of(s), Plan) and plan_of(plan_of(s)).source is s for s in (ds, mix))
    assert plan_of(ds).state_entry() is None and plan_of(mix).state_entry() is not None


def test_the_source_contract_is_narrow() -> None:
    """What is read has at most 10 members (issue 40); how a run reads it is the plan's."""
    members = {n for n in vars(Source) if not n.startswith("_")} | set(
        Source.__annotations__)
    assert len(members) <= 10, sorted(members)
    assert not members & {"order", "order_seed", "resolve_lanes", "working_set_row_groups",
                          "state_entry", "resumed", "check_ready", "end"}


def test_the_normaliser_refuses_what_does_not_apply(urls) -> None:
    ds = open_dataset(urls["a"])
    with pytest.raises(ValueError, match="expect_dataset_id pins one dataset"):
        open_source(_mix_dict(urls), expect_dataset_id=ds.dataset_id)
    with pytest.raises(ValueError, match="decoded_cache applies to a dataset the loader opens"):
        open_source(ds, decoded_cache="/tmp/x")
    with pytest.raises(ValueError, match="no mixtures here"):
        open_source(_mix_dict(urls), no_mixture="no mixtures here")
    with pytest.raises(z.ManifestError):
        open_source(urls["a"], expect_dataset_id=open_dataset(urls["b"]).dataset_id)


def test_the_seed_rule_is_the_plans(urls) -> None:
    ds, mix = plan_of(open_source(urls["a"])), plan_of(open_source(_mix_dict(urls, seed=9)))
    assert (ds.order_seed(None), ds.order_seed(4)) == (0, 4)
    assert (mix.order_seed(None), mix.order_seed(9)) == (9, 9)
    with pytest.raises(MixtureError, match="sets seed 9 but seed 4 was given"):
        mix.order_seed(4)


def test_a_dataset_answers_the_contract_as_the_loader_did(urls) -> None:
    ds = open_source(urls["a"])
    plan = plan_of(ds)
    t = Topology(global_batch=8)
    auto = OrderOptions(seed=3, lanes="auto")
    assert plan.resolve_lanes(auto, t) == auto.resolved(
        ds.manifest.num_row_groups, ds.num_samples, nodes=1, node_batch=8)
    assert plan_of(open_source(_mix_dict(urls))).resolve_lanes(auto, t) == auto
    src, local = ds.split_ids([3, 1])     # always a source index: one dataset is source 0
    assert src.tolist() == [0, 0] and local.tolist() == [3, 1]
    assert plan.seq_fields([3, 1])["_seq"].tolist() == [3, 1] and len(plan.seq_fields([3])) == 1
    assert plan.resumed(None, 16, step=2, global_batch=8) is plan
    assert plan.end is None and [d for _, d in ds.parts()] == [ds]
    assert ds.row_group_of([0, 10, 39]).tolist() == [0, 1, 3]
    mix = open_source(_mix_dict(urls))
    assert [n for n, _ in mix.parts()] == ["a", "b"]
    assert mix.row_group_of([0, 40, 64]).tolist() == [0, 4, 6]    # a's 4 row groups first
    assert sorted(plan_of(mix).seq_fields([41])) == ["_seq", "_source"]
    space = plan_of(mix).deny_ids()   # a deny list names each source's own ids
    assert space.names == ("a", "b") and space.num_samples == mix.num_samples
    assert space.offsets == (0, mix.sources[0].num_samples)
    assert space.dataset_id.startswith("mixids:")


def test_only_the_normaliser_asks_whether_it_holds_a_mixture() -> None:
    asking = set()
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel != "load/source.py" and ASKS.search(path.read_text(encoding="utf-8")):
            asking.add(rel)
    assert not asking, f"asks whether it holds a mixture: {sorted(asking)}"


def _builders(texts: dict[str, str]) -> list[str]:
    return sorted(rel for rel, text in texts.items()
                  if rel not in ("load/source.py", "mix/mixed.py") and BUILDS.search(text))


def test_only_the_normaliser_builds_a_mixture() -> None:
    """Every front end (the loaders, TorchTitan, Grain, the CLI, plan) gets its mixture
    from :func:`open_source`, so the seed rule, the columns and the stage placement are
    the normaliser's; TorchTitan, which needs the sources' seq_len before its global batch,
    opens them with ``open_parts`` and hands those to the loader."""
    texts = {path.relative_to(PKG).as_posix(): path.read_text(encoding="utf-8")
             for path in PKG.rglob("*.py")}
    assert not _builders(texts), f"builds a mixture itself: {_builders(texts)}"
    # TorchTitan's former spelling is caught, under its import alias too.
    before = ("from ..mix.mixed import open_sources as open_mixture_sources\n"
              "spec = mixture_spec(url)\nmix = build_mixture(spec, open_mixture_sources(spec))")
    assert _builders({"integrations/torchtitan.py": before}) == ["integrations/torchtitan.py"]


def test_parts_open_first_and_resolve_as_the_whole_spelling_does(urls) -> None:
    """``open_parts`` then ``open_source`` gives the mixture ``open_source`` gives at once:
    same identity and schedule, its stage starts in steps placed by the batch given to
    the second call; a dataset's parts are the dataset itself."""
    from zephon_store.load.source import MixtureParts, open_parts

    d = {"seed": 4, "stages": [{"name": "s", "start": {"samples": 0}},
                               {"name": "t", "start": {"steps": 3}}],
         "sources": [{"name": k, "url": u, "weights": [0.5, 0.5]} for k, u in urls.items()]}
    parts = open_parts(d)
    assert isinstance(parts, MixtureParts) and not isinstance(parts, Source)
    assert [n for n, _ in parts.parts()] == ["a", "b"] and parts.order_seed(None) == 4
    with pytest.raises(MixtureError, match="sets seed 4 but seed 1 was given"):
        parts.order_seed(1)
    for batch in (4, 6):
        mix = open_source(parts, global_batch=batch, columns=["id"])
        whole = open_source(d, global_batch=batch, columns=["id"])
        assert mix.dataset_id == whole.dataset_id and mix.columns == ["id"]
        assert [s for s, _ in mix.schedule.stages] == [0, 3 * batch]
        assert mix.sources == parts.sources      # opened once, shared
    ds = open_dataset(urls["a"])
    assert open_parts(ds) is ds and open_parts(urls["a"]).dataset_id == ds.dataset_id
    with pytest.raises(ValueError, match="not here"):
        open_parts(d, no_mixture="not here")


def test_a_mixture_reads_and_prefetches_through_its_sources(urls, tmp_path) -> None:
    """A mixture's row groups are read and fetched ahead by each source (no stand-ins):
    with every source behind a disk cache the loader prefetches into it, and hands out the
    batches it hands out without one."""
    from zephon_store.io.cache import ChunkCache
    from zephon_store.load.loader import Loader
    from zephon_store.load.options import BatchOptions, SourceOptions, StopOptions

    def run(**kw) -> list[list[int]]:
        loader = Loader(_mix_dict(urls), topology=Topology(8), seed=5,
                        batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=6), **kw)
        return [b["_seq"].tolist() + b["_source"].tolist() for b in loader]

    cache = ChunkCache(str(tmp_path / "cache"))
    assert run(source=SourceOptions(cache=cache)) == run()
    assert any((tmp_path / "cache").rglob("*")), "the sources' bytes went through the cache"


class _EveryThird:
    """A deny list's one question: which ids are masked (those divisible by 3)."""

    def masked(self, ids):
        return ids % 3 == 0


def test_one_datasets_order_is_a_mixture_of_one_source() -> None:
    """The audit counts a mixture per source and source epoch; a dataset's order answers the
    same per-source view (source 0, its stream the positions), so that count over a dataset
    equals the one-epoch-at-a-time count the audit takes for it: repeats, gaps, a partial
    first and last epoch and deny-list masks included."""
    import numpy as np

    from zephon_store.order.order import Order
    from zephon_store.runs.audit import _dataset_epochs, _source_epochs

    order = Order(np.array([7, 7, 6]), OrderOptions(seed=4, window_blocks=1))
    src, index = order.source_positions(np.arange(5, 9))
    assert src.tolist() == [0] * 4 and index.tolist() == [5, 6, 7, 8]
    assert order.split_ids([3])[0] is None and order.source_names == (None,)
    assert order.consumed(11).tolist() == [11]
    # Positions 3..30, 25..52 read twice (a resume from an older checkpoint), 60..70 never.
    intervals = [(3, 30, order, None), (25, 60, order, _EveryThird()),
                 (70, 75, order, None)]
    fast = _dataset_epochs(intervals, order, 3, 75, chunk=8, workers=2)
    general = _source_epochs(intervals, order, 3, 75, chunk=8)
    assert general == fast
    assert any(e.repeated for e in fast[0]) and any(e.masked for e in fast[0])
    assert any(e.skipped for e in fast[0]) and any(not e.complete for e in fast[0])
