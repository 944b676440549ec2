"""Mixture files: valid TOML/JSON become a spec and a schedule; every bad input is a clear
error naming the file and the key (or the line, for syntax errors)."""

from __future__ import annotations

import json
import textwrap
from fractions import Fraction

import jsonschema
import numpy as np
import pytest

from zephon_store.errors import MixtureError
from zephon_store.format.mixture_file import (
    MixtureSpec,
    load_mixture_file,
    mixture_json_schema,
    parse_mixture,
)
from zephon_store.order.mixture import MixtureSchedule

GOOD = """\
weight_unit = "samples"
exhaustion = "error"
seed = 7

[[stages]]
name = "warmup"
start = { steps = 0 }

[[stages]]
name = "main"
start = { steps = 100 }

[[sources]]
name = "web"
url = "s3://bucket/web"
storage_options = { endpoint_url = "http://127.0.0.1:9000" }
weights = [0.6, 0.5]

[[sources]]
name = "code"
url = "code"
weights = { warmup = 0.3, main = "3/10" }
max_epochs = 2

[[sources]]
name = "math"
url = "/data/math"
weights = [0.1, 0.2]
"""


def write(tmp_path, text: str, name: str = "mix.toml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_a_toml_file_becomes_a_spec_and_a_schedule(tmp_path) -> None:
    path = write(tmp_path, GOOD)
    spec = load_mixture_file(path)
    assert spec.source_names == ("web", "code", "math")
    assert spec.stage_names == ("warmup", "main")
    assert spec.sources[0].storage_options == {"endpoint_url": "http://127.0.0.1:9000"}
    assert spec.sources[1].url == str(tmp_path / "code")          # relative to the file
    assert spec.max_epochs == (None, 2, None) and spec.seed == 7
    assert spec.stage_weights()[1] == [Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)]
    s = MixtureSchedule.from_spec(spec, global_batch=32, epoch_sizes=[10**6, 1000, 10**6])
    assert s.stages[1][0] == 3200
    assert s.names == spec.source_names
    assert s.exhausted_at()[1] is not None
    assert s.consumed(3200).tolist() == [1920, 960, 320]
    # the same content as JSON, and the spec's own dict, give the same spec
    again = MixtureSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    jpath = write(tmp_path, json.dumps(spec.to_dict()), "mix.json")
    assert load_mixture_file(jpath) == spec
    jsonschema.Draft202012Validator(mixture_json_schema()).validate(spec.to_dict())


def test_defaults_one_stage_and_a_single_weight(tmp_path) -> None:
    spec = parse_mixture('{"sources": [{"name": "a", "url": "/a", "weight": 0.25},'
                         ' {"name": "b", "url": "/b", "weight": "3/4"}]}')
    assert spec.stage_names == ("main",) and spec.exhaustion == "error"
    s = MixtureSchedule.from_spec(spec)
    assert s.locate(np.arange(8))[0].tolist().count(0) == 2


def test_token_weights_and_token_starts() -> None:
    spec = MixtureSpec.from_dict({
        "weight_unit": "tokens",
        "stages": [{"name": "a", "start": {"tokens": 0}},
                   {"name": "b", "start": {"tokens": 1_000_000}}],
        "sources": [{"name": "short", "url": "/s", "weights": [0.5, 0.5]},
                    {"name": "long", "url": "/l", "weights": {"a": 0.5, "b": 0.5}}]})
    with pytest.raises(MixtureError, match="needs mean_sizes"):
        MixtureSchedule.from_spec(spec, tokens_per_sample=2048)
    with pytest.raises(MixtureError, match="needs tokens_per_sample > 0"):
        MixtureSchedule.from_spec(spec, mean_sizes=[100, 300])
    s = MixtureSchedule.from_spec(spec, tokens_per_sample=2048,
                                  mean_sizes={"short": 100, "long": 300})
    assert s.stages[1][0] == 489                      # ceil(10**6 / 2048)
    assert s.stages[0][1] == (Fraction(3, 4), Fraction(1, 4))
    with pytest.raises(MixtureError, match="mean_sizes has no entry for source 'long'"):
        MixtureSchedule.from_spec(spec, tokens_per_sample=2048, mean_sizes={"short": 100})
    with pytest.raises(MixtureError, match="epoch_sizes has 1 entries for 2 sources"):
        MixtureSchedule.from_spec(spec, tokens_per_sample=2048, mean_sizes=[1, 2],
                                  epoch_sizes=[5])


@pytest.mark.parametrize("text,match", [
    # weights not summing to 1, negative, missing for a stage, for an unknown stage
    (GOOD.replace("weights = [0.1, 0.2]", "weights = [0.1, 0.3]"),
     r"mix.toml: stage 'main': weights sum to 1.1, not 1"),
    (GOOD.replace("weights = [0.1, 0.2]", "weights = [-0.1, 0.2]"),
     r"mix.toml: at sources/2/weights/0: -0.1 is less than the minimum of 0"),
    (GOOD.replace('weights = [0.1, 0.2]', 'weights = ["-1/10", 0.2]'),
     r"at sources/2/weights/0 \(source 'math', stage 'warmup'\): weight '-1/10' is negative"),
    (GOOD.replace('weights = { warmup = 0.3, main = "3/10" }', "weights = { warmup = 0.3 }"),
     r"at sources/1 \('code'\)/weights: no weight for stage 'main'"),
    (GOOD.replace('weights = { warmup = 0.3, main = "3/10" }',
                  'weights = { warmup = 0.3, mian = 0.3 }'),
     r"no stage is named 'mian'"),
    (GOOD.replace("weights = [0.1, 0.2]", "weights = [0.1]"),
     r"sources/2 \('math'\)/weights: 1 weights for 2 stages"),
    (GOOD.replace("weights = [0.1, 0.2]", ""), r"give exactly one of 'weight'"),
    # a source missing its url, no sources at all, a duplicate name
    (GOOD.replace('url = "/data/math"\n', ""), r"at sources/2: 'url' is a required property"),
    ('weight_unit = "samples"\n', r"at \(top level\): 'sources' is a required property"),
    (GOOD.replace('name = "math"', 'name = "web"'), r"sources/2: source name 'web' is used twice"),
    # stage boundaries in the past / not at 0
    (GOOD.replace("start = { steps = 100 }", "start = { steps = 0 }"),
     r"stages/1 \('main'\) starts at steps 0, not after stage 'warmup'"),
    (GOOD.replace("start = { steps = 0 }", "start = { steps = 5 }"),
     r"stages/0 \('warmup'\) starts at steps 5; the first stage must start at 0"),
    (GOOD.replace("start = { steps = 100 }", "start = { steps = 100, samples = 3 }"),
     r"at stages/1/start: .* has too many properties"),
    # unknown keys, bad enums
    (GOOD.replace("seed = 7", "sed = 7"),
     r"at \(top level\): Additional properties are not allowed \('sed' was unexpected\)"),
    (GOOD.replace("max_epochs = 2", "max_epoch = 2"), r"at sources/1: Additional properties"),
    (GOOD.replace('exhaustion = "error"', 'exhaustion = "wrap"'), r"at exhaustion: 'wrap' is not one of"),
    (GOOD.replace("max_epochs = 2", "max_epochs = 0"), r"at sources/1/max_epochs: 0 is less than"),
])
def test_bad_files_are_clear_errors(tmp_path, text, match) -> None:
    with pytest.raises(MixtureError, match=match):
        load_mixture_file(write(tmp_path, text))


def test_normalize_is_asked_for_not_implied(tmp_path) -> None:
    text = GOOD.replace("weights = [0.1, 0.2]", "weights = [0.1, 0.3]")
    spec = load_mixture_file(write(tmp_path, "normalize = true\n" + text))
    assert sum(spec.stage_weights()[1]) == 1
    assert spec.stage_weights()[1][2] == Fraction(3, 11)


def test_syntax_errors_name_the_line(tmp_path) -> None:
    bad = GOOD.replace('name = "code"', 'name = "code')
    with pytest.raises(MixtureError, match=r"mix.toml: not valid TOML: .*line 20, column 13"):
        load_mixture_file(write(tmp_path, bad))
    with pytest.raises(MixtureError, match=r"mix.json: line 3, column 1: not valid JSON"):
        load_mixture_file(write(tmp_path, '{"sources": [\n  {"name": "a"},\n]}', "mix.json"))
    with pytest.raises(MixtureError, match=r"mixture file .*nope.toml does not exist"):
        load_mixture_file(tmp_path / "nope.toml")


def test_starts_that_cross_after_conversion_are_refused() -> None:
    spec = MixtureSpec.from_dict({
        "stages": [{"name": n, "start": start} for n, start in
                   (("a", {"samples": 0}), ("b", {"steps": 10}), ("c", {"samples": 100}))],
        "sources": [{"name": "x", "url": "/x", "weight": 1}]}, origin="mix.toml")
    assert MixtureSchedule.from_spec(spec, global_batch=8).stages[1][0] == 80
    with pytest.raises(MixtureError, match=r"mix.toml: stages/2 \('c'\) starts at sample 100, "
                                           r"not after stage 'b' \(sample 160\)"):
        MixtureSchedule.from_spec(spec, global_batch=16)
    with pytest.raises(MixtureError, match="needs global_batch > 0"):
        MixtureSchedule.from_spec(spec)
