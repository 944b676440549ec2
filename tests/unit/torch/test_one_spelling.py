"""One spelling per setting (issue 40 item 4): the front ends take the option groups plus
the dataset, who reads, the order, the run log and the deny list; the flat keywords of
before the groups still work for one release, each with a DeprecationWarning naming its
group, and give the same batches."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

from tests.helpers import small_dataset
from zephon_store import (
    BatchOptions,
    Loader,
    OrderOptions,
    SourceOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    as_numpy,
)
from zephon_store.grain import ZephonIterDataset, ZephonSource
from zephon_store.torch import LiveZephonLoader, ReplicaOptions, ZephonLoader


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return small_dataset(str(tmp_path_factory.mktemp("spelling")), files=2, records=40,
                         row_group_rows=8)


def _named(cls) -> list[str]:
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


@pytest.mark.parametrize("cls", [ZephonLoader, LiveZephonLoader])
def test_the_torch_front_ends_have_at_most_twelve_named_parameters(cls) -> None:
    assert len(_named(cls)) <= 12, _named(cls)


def _ids(loader) -> list[list[int]]:
    return [np.asarray(b["_seq"]).tolist() for b in loader]


def test_flat_keywords_warn_and_read_what_the_groups_read(url, tmp_path) -> None:
    grouped = ZephonLoader(url, topology=Topology(6, 2, 1), order=OrderOptions(seed=3),
                           source=SourceOptions(cache=False), stop=StopOptions(max_steps=4),
                           batch=BatchOptions(with_seq=True, collate=as_numpy))
    with pytest.warns(DeprecationWarning) as seen:
        flat = ZephonLoader(url, global_batch=6, world_size=2, rank=1,
                            order=OrderOptions(seed=3), cache=False, max_steps=4,
                            with_seq=True, collate=None)
    said = " ".join(str(w.message) for w in seen)
    for group in ("topology=Topology", "source=SourceOptions", "stop=StopOptions",
                  "batch=BatchOptions"):
        assert group in said
    assert _ids(flat) == _ids(grouped)
    assert isinstance(next(iter(flat))["_seq"], np.ndarray)     # collate=None: numpy


def test_the_groups_alone_warn_nothing(url) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = ZephonLoader(url, topology=Topology(4), seed=1,
                              workers=WorkerOptions(prefetch=2), stop=StopOptions(max_steps=1))
        assert len(list(loader)) == 1
        assert next(iter(ZephonIterDataset(url, topology=Topology(4), source=SourceOptions(),
                                           stop=StopOptions(max_steps=1))))["id"].size == 4
        assert len(ZephonSource(url, source=SourceOptions(cache=False))) == 80


def test_a_group_and_its_flat_keyword_together_are_refused(url) -> None:
    with pytest.raises(TypeError, match="both set where the run stops"), \
            pytest.warns(DeprecationWarning):
        ZephonLoader(url, global_batch=4, stop=StopOptions(epochs=1), max_steps=3)
    with pytest.raises(TypeError, match="topology= and global_batch= both"):
        ZephonLoader(url, global_batch=4, topology=Topology(4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'colums'"):
        ZephonLoader(url, global_batch=4, colums=["id"])
    with pytest.raises(TypeError, match="needs global_batch="):
        ZephonLoader(url)


def test_the_core_and_grain_take_the_source_group(url) -> None:
    with pytest.warns(DeprecationWarning, match="source=SourceOptions"):
        old = Loader(url, topology=Topology(4), cache=False, stop=StopOptions(max_steps=2))
    new = Loader(url, topology=Topology(4), source=SourceOptions(cache=False),
                 stop=StopOptions(max_steps=2))
    assert [b["id"].tolist() for b in old] == [b["id"].tolist() for b in new]
    with pytest.warns(DeprecationWarning, match="source=SourceOptions"):
        ZephonSource(url, cache=False)
    with pytest.warns(DeprecationWarning, match="source=SourceOptions"):
        ZephonIterDataset(url, topology=Topology(4), expect_dataset_id=None)


def test_a_live_loaders_replica_keywords_are_one_group(url) -> None:
    replica = ReplicaOptions(participants=lambda: (0, 2))
    new = LiveZephonLoader(url, global_batch=4, seed=2, replica=replica,
                           batch=BatchOptions(with_seq=True, collate=as_numpy))
    with pytest.warns(DeprecationWarning, match="replica=ReplicaOptions"):
        old = LiveZephonLoader(url, global_batch=4, seed=2, participants=lambda: (0, 2),
                               with_seq=True, collate=None)
    a, b = iter(new), iter(old)
    assert next(a)["_seq"].tolist() == next(b)["_seq"].tolist()
    with pytest.raises(ValueError, match="ReplicaOptions"):
        LiveZephonLoader(url, global_batch=4)
