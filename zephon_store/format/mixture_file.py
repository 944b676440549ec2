"""The mixture file: sources, their weights per stage, and the stages (TOML or JSON).

A file is checked against ``mixture.schema.json`` (types, unknown keys), then for meaning
(every source weighs something in every stage, weights sum to 1, stage starts increase);
every error names the file and the key path, and a syntax error names the line. The result
is a :class:`MixtureSpec`: plain data, no I/O past reading the file.
:meth:`zephon_store.order.mixture.MixtureSchedule.from_spec` turns it into the schedule once
the global batch (for starts in steps), tokens per sample (starts in tokens) and, for token
or byte weights, each source's mean size per sample are known. docs/mixtures.md has examples.

>>> spec = parse_mixture('''
... exhaustion = "renormalize"
... [[stages]]
... name = "warmup"
... start = {steps = 0}
... [[stages]]
... name = "main"
... start = {steps = 1000}
... [[sources]]
... name = "web"
... url = "s3://corpus/web"
... weights = [0.7, 0.5]
... [[sources]]
... name = "code"
... url = "/data/code"
... weights = {warmup = 0.3, main = 0.5}
... max_epochs = 2
... ''', fmt="toml")
>>> spec.source_names, spec.stage_starts(global_batch=512)
(('web', 'code'), [0, 512000])
>>> [[str(w) for w in ws] for ws in spec.stage_weights()]
[['7/10', '3/10'], ['1/2', '1/2']]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from typing import Any

from .._util import weights as _w
from .._util.regular import NotRegularFileError, read_regular
from ..errors import MixtureError

__all__ = ["MixtureSpec", "SourceSpec", "StageSpec", "load_mixture_file", "mixture_json_schema",
           "parse_mixture"]

WEIGHT_UNITS = ("samples", "tokens", "bytes")
START_UNITS = ("steps", "samples", "tokens")
EXHAUSTION_POLICIES = ("error", "renormalize")
_DEFAULT_STAGE = {"name": "main", "start": {"samples": 0}}
#: A stage starts before this mixture position: the interleave's positions are int64 and its
#: products stay below 2**62 (order/interleave.py), and no run reaches it.
MAX_START = 1 << 62
#: Nesting a mixture file never needs (storage options are a few levels deep); deeper is
#: refused by key, before anything recurses into it (the parsers, the schema check).
MAX_DEPTH = 32
#: A mixture file larger than this is not a mixture file (a thousand sources take ~200 KB).
MAX_FILE_BYTES = 16 << 20
# Python refuses to convert integers longer than this (sys.get_int_max_str_digits()).
_INT_DIGITS = 4300


def mixture_json_schema() -> dict:
    """The JSON Schema of a mixture file (``zephon_store/format/mixture.schema.json``)."""
    text = resources.files("zephon_store.format").joinpath("mixture.schema.json").read_text()
    return json.loads(text)


@dataclass(frozen=True)
class SourceSpec:
    """One source: where it lives, its weight in each stage (exact), and its epoch cap."""

    name: str
    url: str
    weights: tuple[Fraction, ...]
    storage_options: Mapping[str, Any] | None = None
    max_epochs: int | None = None

    def to_dict(self, stage_names: Sequence[str]) -> dict[str, Any]:
        weights = {s: _w.fraction_text(w) for s, w in zip(stage_names, self.weights)}
        d: dict[str, Any] = {"name": self.name, "url": self.url, "weights": weights}
        if self.storage_options is not None:
            d["storage_options"] = dict(self.storage_options)
        if self.max_epochs is not None:
            d["max_epochs"] = self.max_epochs
        return d


@dataclass(frozen=True)
class StageSpec:
    """A stage: its name and where it starts, in ``unit`` (steps, samples or tokens)."""

    name: str
    unit: str
    start: int


@dataclass(frozen=True)
class MixtureSpec:
    """A validated mixture file. Build it with :func:`load_mixture_file`,
    :func:`parse_mixture` or :meth:`from_dict`; weights are exact and sum to 1 per stage
    (in ``weight_unit``)."""

    sources: tuple[SourceSpec, ...]
    stages: tuple[StageSpec, ...]
    weight_unit: str = "samples"
    exhaustion: str = "error"
    seed: int | None = None
    origin: str = field(default="<mixture>", compare=False)

    @property
    def source_names(self) -> tuple[str, ...]:
        """Source names, in file order (the source index of the mixture)."""
        return tuple(s.name for s in self.sources)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stage names, in order."""
        return tuple(s.name for s in self.stages)

    @property
    def max_epochs(self) -> tuple[int | None, ...]:
        """Per source epoch cap (None = uncapped)."""
        return tuple(s.max_epochs for s in self.sources)

    def stage_weights(self) -> list[list[Fraction]]:
        """Per stage, the exact weight of each source (in :attr:`weight_unit`; they sum to 1)."""
        return [[s.weights[j] for s in self.sources] for j in range(len(self.stages))]

    def stage_starts(self, *, global_batch: int | None = None,
                     tokens_per_sample: int | None = None, step: int = 0, cursor: int = 0,
                     fixed: Mapping[int, int] | None = None,
                     check_order: bool = True) -> list[int]:
        """Stage starts in mixture samples.

        A start in steps is the sample where the run's step ``n`` begins: ``n *
        global_batch`` for a run that starts at step 0, and ``cursor + (n - step) *
        global_batch`` for one resumed at ``step`` (the checkpoint's step count) and
        ``cursor``, so a stage given in steps begins at that step of the run whatever global
        batch the run had before. A start in tokens is ``ceil(tokens / tokens_per_sample)``
        (tokens per sample = the sequence length for packed windows). ``fixed`` maps a stage
        index to the sample a checkpoint fixed it at (a stage that began before the resume),
        replacing the conversion.

        Raises :class:`MixtureError` naming the stage if a needed value is missing, a start
        lies past :data:`MAX_START`, or (``check_order``) the starts do not strictly
        increase.

        >>> spec = MixtureSpec.from_dict({"stages": [
        ...     {"name": "a", "start": {"steps": 0}}, {"name": "b", "start": {"steps": 10}}],
        ...     "sources": [{"name": "s", "url": "s", "weight": 1}]})
        >>> spec.stage_starts(global_batch=8)          # a run from step 0
        [0, 80]
        >>> spec.stage_starts(global_batch=4, step=6, cursor=48, fixed={0: 0})   # resumed
        [0, 64]
        """
        fixed = fixed or {}
        out = []
        for j, st in enumerate(self.stages):
            where = f"{self.origin}: stages/{j} ({st.name!r})"
            if j in fixed:
                out.append(int(fixed[j]))
            elif st.unit == "samples":
                out.append(st.start)
            elif st.unit == "steps":
                if not _positive_int(global_batch):
                    raise MixtureError(f"{where} starts at step {st.start}; converting steps to "
                                       f"samples needs global_batch > 0, got {global_batch!r}")
                out.append(cursor + (st.start - step) * global_batch)
            else:
                if not _positive_int(tokens_per_sample):
                    raise MixtureError(
                        f"{where} starts at token {st.start}; converting tokens to samples "
                        f"needs tokens_per_sample > 0, got {tokens_per_sample!r}")
                out.append(-(-st.start // tokens_per_sample))
            if out[j] >= MAX_START:
                raise MixtureError(
                    f"{where} starts at {st.unit} {st.start}, mixture sample {out[j]}, past "
                    f"the last position a run reaches (2**62); give a nearer start")
        if check_order:
            for j in range(1, len(out)):
                if out[j] <= out[j - 1]:
                    st = self.stages[j]
                    raise MixtureError(
                        f"{self.origin}: stages/{j} ({st.name!r}) starts at sample {out[j]}, "
                        f"not after stage {self.stages[j - 1].name!r} (sample {out[j - 1]}); "
                        "stage starts must strictly increase")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The file's content as plain JSON (exact weights as fraction strings, a table per
        source); :meth:`from_dict` reads it back to an equal spec."""
        d: dict[str, Any] = {
            "version": 1, "weight_unit": self.weight_unit, "exhaustion": self.exhaustion,
            "stages": [{"name": s.name, "start": {s.unit: s.start}} for s in self.stages],
            "sources": [s.to_dict(self.stage_names) for s in self.sources],
        }
        if self.seed is not None:
            d["seed"] = self.seed
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<mixture>",
                  base_dir: str | None = None) -> MixtureSpec:
        """Validate ``d`` (the parsed file) and build the spec. ``origin`` names the file in
        errors; relative local source URLs are resolved against ``base_dir`` when given."""
        _check_schema(d, origin)
        stages = [StageSpec(s["name"], *next(iter(s["start"].items())))
                  for s in d.get("stages", [_DEFAULT_STAGE])]
        stage_names = [s.name for s in stages]
        _unique(stage_names, origin, "stages", "stage")
        if stages[0].start != 0:
            raise MixtureError(f"{origin}: stages/0 ({stages[0].name!r}) starts at "
                               f"{stages[0].unit} {stages[0].start}; the first stage must "
                               "start at 0")
        for j in range(1, len(stages)):
            a, b = stages[j - 1], stages[j]
            if a.unit == b.unit and b.start <= a.start:
                raise MixtureError(
                    f"{origin}: stages/{j} ({b.name!r}) starts at {b.unit} {b.start}, not "
                    f"after stage {a.name!r} ({a.unit} {a.start}); stage starts must strictly "
                    "increase")
        raw = d["sources"]
        _unique([s["name"] for s in raw], origin, "sources", "source")
        table = [_source_weights(s, i, stage_names, origin) for i, s in enumerate(raw)]
        normalize = bool(d.get("normalize", False))
        names = [s["name"] for s in raw]
        per_stage = []
        for j, st in enumerate(stages):
            per_stage.append(_w.check_weights(
                [row[j] for row in table], normalize=normalize, names=names,
                where=f"{origin}: stage {st.name!r}", error=MixtureError))
        sources = tuple(
            SourceSpec(name=s["name"], url=_resolve(s["url"], base_dir),
                       weights=tuple(per_stage[j][i] for j in range(len(stages))),
                       storage_options=s.get("storage_options"), max_epochs=s.get("max_epochs"))
            for i, s in enumerate(raw))
        return cls(sources=sources, stages=tuple(stages),
                   weight_unit=d.get("weight_unit", "samples"),
                   exhaustion=d.get("exhaustion", "error"), seed=d.get("seed"), origin=origin)


def parse_mixture(text: str, *, fmt: str | None = None, origin: str = "<mixture>",
                  base_dir: str | None = None) -> MixtureSpec:
    """Parse mixture-file text (``fmt`` "toml" or "json"; guessed from the first character
    when None) and validate it. A syntax error names ``origin`` and the line."""
    if fmt is None:
        fmt = "json" if text.lstrip().startswith("{") else "toml"
    if fmt not in ("json", "toml"):
        raise MixtureError(f"{origin}: unknown mixture file format {fmt!r}; use 'toml' or 'json'")
    try:
        if fmt == "json":
            try:
                d = json.loads(text)
            except json.JSONDecodeError as exc:
                raise MixtureError(f"{origin}: line {exc.lineno}, column {exc.colno}: not "
                                   f"valid JSON: {exc.msg}") from None
        else:
            tomllib = _tomllib()
            try:
                d = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise MixtureError(f"{origin}: not valid TOML: {exc}") from None
    except MixtureError:
        raise   # a syntax error above, already naming the file: not wrapped again below
    except RecursionError:
        # The parsers recurse once per level: say where, from the text, instead.
        raise MixtureError(f"{origin}: at {_deep_key(text)}: nested more than {MAX_DEPTH} "
                           "levels deep; a mixture file needs a few") from None
    except ValueError as exc:
        if "digits" not in str(exc):
            raise MixtureError(f"{origin}: not valid {fmt.upper()}: {exc}") from None
        raise MixtureError(f"{origin}: {_long_int_where(text)}: an integer of more than "
                           f"{_INT_DIGITS} digits; no mixture key takes one") from None
    _check_depth(d, origin)
    if isinstance(d, dict) and "dataset_id" in d and "sources" not in d:
        # A dataset's manifest.json passed where a dataset goes: its folder is the dataset.
        folder = os.path.dirname(os.path.abspath(origin)) if base_dir is not None else "its folder"
        raise MixtureError(f"{origin} is a dataset's manifest, not a mixture file; pass the "
                           f"dataset's folder ({folder})")
    return MixtureSpec.from_dict(d, origin=origin, base_dir=base_dir)


def load_mixture_file(path: str | os.PathLike) -> MixtureSpec:
    """Read and validate a local mixture file (``.toml`` or ``.json``).

    Relative local source URLs are resolved against the file's folder.

    >>> p = os.path.join(tmp, "mix.json")
    >>> _ = open(p, "w").write('{"sources": [{"name": "a", "url": "a", "weight": 1}]}')
    >>> spec = load_mixture_file(p)
    >>> spec.sources[0].url == os.path.join(tmp, "a"), spec.stage_names
    (True, ('main',))
    """
    path = os.fspath(path)
    try:
        data = read_regular(path, max_bytes=MAX_FILE_BYTES)
    except FileNotFoundError:
        raise MixtureError(f"mixture file {path} does not exist") from None
    except NotRegularFileError as exc:
        raise MixtureError(f"mixture file {exc}; pass a .toml or .json file") from None
    except OSError as exc:
        raise MixtureError(f"mixture file {path} could not be read: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise MixtureError(f"mixture file {path} is larger than {MAX_FILE_BYTES >> 20} MiB; "
                           "a mixture file names sources and weights (a few KB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MixtureError(f"mixture file {path} could not be read: {exc}") from None
    ext = os.path.splitext(path)[1].lower()
    fmt = {".toml": "toml", ".json": "json"}.get(ext)
    return parse_mixture(text, fmt=fmt, origin=path,
                         base_dir=os.path.dirname(os.path.abspath(path)))


# --- helpers ---------------------------------------------------------------------------------

def _tomllib():
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise MixtureError("reading a TOML mixture file on Python 3.10 needs 'tomli' "
                               "(pip install tomli), or write the file as JSON") from None
    return tomllib


_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')
_KEY_BEFORE = re.compile(r'(?:"([^"\\\n]*)"|\'([^\'\n]*)\'|([A-Za-z0-9_.-]+))\s*[:=]\s*$')


def _key_before(text: str, pos: int) -> str | None:
    m = _KEY_BEFORE.search(text, max(0, pos - 256), pos)
    return None if m is None else next(g for g in m.groups() if g is not None)


def _deep_key(text: str) -> str:
    """The key whose value nests deeper than :data:`MAX_DEPTH` (from the text: the file did
    not parse), or "(top level)"."""
    opened: list[int] = []
    for m in _BRACKETS.finditer(text):
        c = m.group()
        if c in "[{":
            opened.append(m.start())
            if len(opened) > MAX_DEPTH:
                break
        elif c in "]}" and opened:
            opened.pop()
    for pos in opened:   # the outermost bracket that is a key's value
        key = _key_before(text, pos)
        if key is not None:
            return key
    return "(top level)"


def _long_int_where(text: str) -> str:
    """Line and key of the first integer too long to convert (the file did not parse)."""
    m = re.search(r"\d{" + str(_INT_DIGITS + 1) + ",}", text)
    if m is None:
        return "(top level)"
    line = text.count("\n", 0, m.start()) + 1
    keys = re.findall(r'["\']?([A-Za-z0-9_.-]+)["\']?\s*[:=]', text[:m.start()])
    return f"line {line}" + (f", key {keys[-1]!r}" if keys else "")


def _check_depth(d: object, origin: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_DEPTH`, naming the key (iteratively:
    the check itself must not recurse)."""
    todo: list[tuple[object, tuple, int]] = [(d, (), 0)]
    while todo:
        node, path, depth = todo.pop()
        if depth > MAX_DEPTH:
            where = "/".join(str(p) for p in path[:3]) or "(top level)"
            raise MixtureError(f"{origin}: at {where}: nested more than {MAX_DEPTH} levels "
                               "deep; a mixture file needs a few")
        if isinstance(node, Mapping):
            todo.extend((v, (*path, k), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, (*path, i), depth + 1) for i, v in enumerate(node))


def _check_schema(d: object, origin: str) -> None:
    import jsonschema

    if not isinstance(d, Mapping):
        raise MixtureError(f"{origin}: a mixture file must hold a table/object at the top, got "
                           f"{type(d).__name__}")
    validator = jsonschema.Draft202012Validator(mixture_json_schema())
    errors = sorted(validator.iter_errors(d), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{origin}: at {'/'.join(str(p) for p in e.absolute_path) or '(top level)'}: "
                 f"{e.message}" for e in errors]
        raise MixtureError("\n".join(lines))


def _unique(names: list[str], origin: str, key: str, what: str) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise MixtureError(f"{origin}: at {key}/{i}: {what} name {n!r} is used twice; "
                               f"{what} names must be unique")
        seen.add(n)


def _source_weights(s: Mapping[str, Any], i: int, stages: list[str], origin: str) -> list:
    where = f"{origin}: at sources/{i} ({s['name']!r})"
    if ("weight" in s) == ("weights" in s):
        raise MixtureError(f"{where}: give exactly one of 'weight' (the same in every stage) "
                           "or 'weights' (one per stage)")
    def parse(value: object, key: str, stage: str | None = None) -> Fraction:
        what = f"source {s['name']!r}" + (f", stage {stage!r}" if stage else "")
        return _w.parse_weight(value, f"{origin}: at sources/{i}/{key} ({what})",
                               error=MixtureError)

    if "weight" in s:
        return [parse(s["weight"], "weight")] * len(stages)
    ws = s["weights"]
    if isinstance(ws, Mapping):
        unknown = [k for k in ws if k not in stages]
        if unknown:
            raise MixtureError(f"{where}/weights: no stage is named {unknown[0]!r}; stages are "
                               f"{stages}")
        missing = [k for k in stages if k not in ws]
        if missing:
            raise MixtureError(f"{where}/weights: no weight for stage {missing[0]!r} (give 0 "
                               "to leave the source out of it)")
        return [parse(ws[k], f"weights/{k}") for k in stages]
    if len(ws) != len(stages):
        raise MixtureError(f"{where}/weights: {len(ws)} weights for {len(stages)} stages "
                           f"{stages}; give one per stage")
    return [parse(w, f"weights/{j}", stages[j]) for j, w in enumerate(ws)]


def _resolve(url: str, base_dir: str | None) -> str:
    if base_dir is None or "://" in url or os.path.isabs(url):
        return url
    return os.path.normpath(os.path.join(base_dir, url))


def _positive_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0
