"""A mixture's repr says what it mixes, and a source that cannot be opened is one clear
error (issue 41 item 7)."""

from __future__ import annotations

import traceback

import pytest

from tests.helpers import converted, two_stage_mixture
from zephon_store import MixtureError, open_mixture


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixconv")
    return (converted(d / "web", files=1, records=40, seed=1),
            converted(d / "code", files=1, records=25, seed=2))


def test_a_missing_source_is_one_error_naming_it(sources, tmp_path):
    missing = str(tmp_path / "no-such-ds")
    path = two_stage_mixture(tmp_path / "m.json", {"web": (sources[0], [1, 0.5]),
                                                   "code": (missing, [0, 0.5])})
    with pytest.raises(MixtureError) as info:
        open_mixture(path)
    exc = info.value
    assert exc.__cause__ is None and exc.__suppress_context__
    text = "".join(traceback.format_exception(exc))
    assert "The above exception" not in text and "During handling" not in text
    msg = str(exc)
    assert "'code'" in msg and missing in msg and path in msg


def test_repr_names_sources_sizes_columns_and_stages(sources, tmp_path):
    path = two_stage_mixture(tmp_path / "m.json", {"web": (sources[0], [1, 0.5]),
                                                   "code": (sources[1], [0, 0.5])})
    mix = open_mixture(path, global_batch=4)
    text = repr(mix)
    assert " at 0x" not in text
    for part in ("'web': 40 samples", "'code': 25 samples", sources[0], sources[1],
                 "num_samples=65", "stages=2", "'text': string", mix.dataset_id):
        assert part in text, part
    assert len(text.splitlines()) <= 8
