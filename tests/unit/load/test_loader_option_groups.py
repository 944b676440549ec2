"""The loaders accept the option groups of ``zephon_store.load.options`` whole (issue 30
item 2): the same batches as the flat keywords, and a group with one of its own keywords is
refused with one line."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

from tests.helpers import small_dataset  # noqa: E402
from zephon_store import (  # noqa: E402
    BatchOptions,
    ReadAheadOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    as_numpy,
)
from zephon_store.torch import ReplicaOptions, ZephonLoader  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("groups")), files=2, records=50,
                         row_group_rows=10)


def test_groups_give_the_keywords_batches(tiny_dataset):
    flat = ZephonLoader(tiny_dataset, global_batch=8, seed=7, world_size=2, rank=1,
                        columns=["id"], with_seq=True, max_steps=3, prefetch=2,
                        decode_ahead_bytes=1 << 20, collate=None)
    grouped = ZephonLoader(tiny_dataset, topology=Topology(8, world_size=2, rank=1), seed=7,
                           batch=BatchOptions(columns=("id",), with_seq=True,
                                              collate=as_numpy),
                           stop=StopOptions(max_steps=3),
                           workers=WorkerOptions(prefetch=2),
                           read_ahead=ReadAheadOptions(decode_ahead_bytes=1 << 20))
    a, b = list(flat), list(itertools.islice(grouped, 5))   # bounded: a lost stop= shows
    assert [x["id"].tolist() for x in a] == [x["id"].tolist() for x in b]
    assert [x["_seq"].tolist() for x in a] == [x["_seq"].tolist() for x in b]
    assert set(b[0]) == {"id", "_seq"}
    assert flat.state_dict() == grouped.state_dict()


@pytest.mark.parametrize("group, keyword", [
    ({"stop": StopOptions(epochs=1.0)}, {"max_steps": 2}),
    ({"batch": BatchOptions(with_seq=True)}, {"columns": ["id"]}),
    ({"workers": WorkerOptions()}, {"num_workers": 2}),
    ({"read_ahead": ReadAheadOptions()}, {"prefetch_bytes": 1 << 20}),
])
def test_a_group_and_its_own_keyword_are_refused(tiny_dataset, group, keyword):
    (name,) = group
    (kw,) = keyword
    with pytest.raises(TypeError, match=rf"{name}=.*{kw}=.*give {kw} in the group or drop "
                                        rf"{name}="):
        ZephonLoader(tiny_dataset, topology=Topology(8, world_size=1, rank=0), seed=7,
                     **group, **keyword)


def test_a_group_of_the_wrong_type_is_refused(tiny_dataset):
    with pytest.raises(TypeError, match="stop= must be a StopOptions, got dict"):
        ZephonLoader(tiny_dataset, topology=Topology(8, world_size=1, rank=0), seed=7,
                     stop={"max_steps": 1})


def test_the_live_loader_takes_the_groups_too(tiny_dataset):
    from zephon_store.torch import LiveZephonLoader

    def first_steps(loader, n=3):
        batches = iter(loader)
        out = []
        for _ in range(n):
            out.append(next(batches)["id"].tolist())
            loader.commit(True)
        return out, loader.state_dict()

    flat = LiveZephonLoader(tiny_dataset, global_batch=8, seed=7, participants=lambda: (1, 3),
                            columns=["id"], epochs=2.0, collate=None)
    grouped = LiveZephonLoader(tiny_dataset, global_batch=8, seed=7,
                               replica=ReplicaOptions(participants=lambda: (1, 3)),
                               batch=BatchOptions(columns=("id",), collate=as_numpy),
                               stop=StopOptions(epochs=2.0))
    assert first_steps(flat) == first_steps(grouped)
    with pytest.raises(TypeError, match="batch=.*columns="):
        LiveZephonLoader(tiny_dataset, global_batch=8, seed=7,
                         replica=ReplicaOptions(participants=lambda: (0, 1)),
                         batch=BatchOptions(), columns=["id"])
    with pytest.raises(ValueError, match="max_steps is not a bound of a live run"):
        LiveZephonLoader(tiny_dataset, global_batch=8, seed=7,
                         replica=ReplicaOptions(participants=lambda: (0, 1)),
                         stop=StopOptions(max_steps=2))
