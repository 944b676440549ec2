"""Which order is this: the inputs the loader reads a stream in, decided in one place.

The loader, ``zephon plan --mixture``, ``trace``, ``where``, ``audit``, ``info`` and the
TorchTitan integration all call these functions, so what the tools say about a run is
computed from the inputs the run itself used (docs/audit.md, STYLE 22):

- :func:`mixture_seed` -- the seed of a mixture's order: the mixture file's ``seed`` unless
  one is given; a given seed that disagrees with the file's is refused, naming both.
- :func:`run_global_batch` -- the global batch that converts a mixture's stage starts in
  steps: the run log's (each segment records its own) or the one given when there is no
  log; a given one that disagrees with the log is refused, naming the line.

>>> mixture_seed(7, None), mixture_seed(None, None), mixture_seed(7, 7), mixture_seed(None, 3)
(7, 0, 7, 3)
>>> mixture_seed(7, 3, origin="mix.toml")
Traceback (most recent call last):
    ...
zephon_store.errors.MixtureError: mix.toml sets seed 7 but seed 3 was given; pass the file's seed or none (the file's is used)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import MixtureError

__all__ = ["mixture_seed", "run_global_batch"]


def mixture_seed(file_seed: int | None, given: int | None, *,
                 origin: str = "the mixture file") -> int:
    """The seed a mixture's order uses.

    ``file_seed``: the mixture file's ``seed`` (None: the file sets none); ``given``: the
    seed the caller was given (None: not given). Not given, the file's seed applies (0 when
    the file sets none); given, it must agree with the file's: a run whose checkpoint holds
    one seed and whose file says another would read another order than the audit computes,
    so the disagreement is a :class:`~zephon_store.errors.MixtureError` naming both.
    """
    if given is None:
        return 0 if file_seed is None else int(file_seed)
    if file_seed is not None and int(file_seed) != int(given):
        raise MixtureError(f"{origin} sets seed {file_seed} but seed {given} was given; pass "
                           "the file's seed or none (the file's is used)")
    return int(given)


def run_global_batch(given: int | None, segments: Sequence | None = None, *,
                     log: str = "the run log") -> int | None:
    """The global batch that converts a mixture's stage starts in steps to samples.

    With a run log (``segments``, :class:`~zephon_store.load.runlog.RunSegment`), the first
    segment's: the run converted its stages in steps with the batch of the launch that
    first read the file, and every later segment's schedule is logged in samples. A
    ``given`` batch (``--global-batch``) must then agree with every segment's, or it is
    refused naming the line. Without a log: ``given`` (None: not known; a mixture whose
    stages start in steps then cannot be placed).

    >>> run_global_batch(8), run_global_batch(None)
    (8, None)
    """
    if not segments:
        return given
    if given is not None:
        for seg in segments:
            if seg.global_batch != given:
                raise MixtureError(
                    f"--global-batch {given} disagrees with {log} line {seg.line}, which "
                    f"records global_batch {seg.global_batch}; leave --global-batch out (the "
                    "log's own is used)")
    return int(segments[0].global_batch)
