"""The TorchTitan config reads a mixture in the loader's own order (issue 29, item 1):
``seed = 0`` (the default) means not given, so the mixture file's seed applies; the file's
seed given again is accepted; another seed is refused in one line naming both, by the one
rule the loader, plan, trace, where and audit share (load/order_inputs.py)."""

from __future__ import annotations

import json

import pytest

from tests.integration.torchtitan_worker import make_packed_dataset

pytestmark = pytest.mark.integration

pytest.importorskip("torchtitan.components.dataloader")


def test_config_seed_follows_the_mixture_file(tmp_path) -> None:
    from zephon_store.errors import MixtureError
    from zephon_store.integrations.torchtitan import ZephonDataLoader

    url = make_packed_dataset(str(tmp_path / "a"), seq_len=32, windows=40)
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"seed": 5, "stages": [{"name": "s", "start": {"steps": 0}}],
                               "sources": [{"name": "a", "url": url, "weights": [1]}]}))

    def build(seed: int):
        return ZephonDataLoader.Config(mixture=str(mix), seed=seed).build(
            dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=2)

    assert build(0).state_dict()["seed"] == 5      # 0: not given, the file's seed
    assert build(5).state_dict()["seed"] == 5
    with pytest.raises(MixtureError, match="sets seed 5 but seed 3 was given"):
        build(3)
