"""Exact mixture weights: parse them, check them, and put them over one integer denominator.

Weights are kept as exact fractions so the interleave of a mixture (``order/mixture.py``)
is pure integer arithmetic: ``0.3`` means 3/10, not the nearest double. Both the mixture
file (``format/``) and the schedule (``order/``) check weights with these functions, so a
file and the Python API accept and refuse exactly the same inputs. ``_util`` sits below
``errors``' users but beside ``errors``, so callers pass the error class to raise
(``error=MixtureError``); the default is ``ValueError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

#: Largest common denominator of a weight vector. The interleave multiplies a remainder
#: (< denominator) by a numerator in int64, so 2 * D**2 must stay below 2**63; 2**30 also
#: keeps 1e-9 (denominator 10**9) exact.
MAX_DENOMINATOR = 1 << 30
#: A sum this close to 1 is decimal rounding (three times 0.3333333333333333), not a mistake;
#: such a vector is normalised exactly instead of refused.
SUM_TOLERANCE = Fraction(1, 10**9)
#: Longest weight string parsed, and the largest decimal exponent in one. ``Fraction`` parses
#: ``"1e-99999999"`` by building ``10**99999999`` (hours of work for 12 bytes); a weight
#: needs nine decimals (the resolution is 2**-30), so these bounds refuse only hostile text.
MAX_WEIGHT_TEXT = 100
MAX_WEIGHT_EXPONENT = 1000
_EXPONENT = re.compile(r"[eE]\s*([+-]?[0-9_]+)\s*$")


def parse_weight(value: object, where: str, *, error: type[Exception] = ValueError) -> Fraction:
    """``value`` (int, float, ``"0.3"``, ``"1/3"``, Fraction) as an exact, non-negative Fraction.

    A float stands for the shortest decimal that prints as it (``0.3`` -> 3/10).

    >>> parse_weight(0.3, "w"), parse_weight("1/3", "w"), parse_weight(1e-9, "w")
    (Fraction(3, 10), Fraction(1, 3), Fraction(1, 1000000000))
    >>> parse_weight(-0.1, "stage 'main', source 'web'")
    Traceback (most recent call last):
    ...
    ValueError: stage 'main', source 'web': weight -0.1 is negative; weights must be >= 0
    """
    if isinstance(value, bool):
        raise error(f"{where}: weight {value!r} is a bool, not a number")
    is_np = hasattr(value, "dtype")
    w = None
    if isinstance(value, Fraction):
        w = value
    elif isinstance(value, int) or (is_np and value.dtype.kind in "iu"):
        w = Fraction(int(value))
    elif isinstance(value, float) or (is_np and value.dtype.kind == "f"):
        if not math.isfinite(float(value)):
            raise error(f"{where}: weight {float(value)!r} is not a finite number")
        w = Fraction(repr(float(value)))
    elif isinstance(value, str):
        w = _parse_text(value, where, error)
    if w is None:
        raise error(f"{where}: weight {value!r} is not a number (give a number >= 0 or a "
                    "fraction string such as '1/3')")
    if w < 0:
        raise error(f"{where}: weight {value!r} is negative; weights must be >= 0")
    return w


def _parse_text(value: str, where: str, error: type[Exception]) -> Fraction | None:
    """A weight string as a Fraction (None: not a number), its size bounded first."""
    if len(value) > MAX_WEIGHT_TEXT:
        raise error(f"{where}: weight {value[:20]!r}... is {len(value)} characters long; give "
                    f"a number or a fraction string of at most {MAX_WEIGHT_TEXT} characters")
    exp = _EXPONENT.search(value)
    if exp is not None:
        try:
            big = abs(int(exp.group(1))) > MAX_WEIGHT_EXPONENT
        except ValueError:
            return None
        if big:
            raise error(f"{where}: weight {value!r} has an exponent beyond "
                        f"+-{MAX_WEIGHT_EXPONENT}; give a number such as 1e-9 or a fraction "
                        "string such as '1/3'")
    try:
        return Fraction(value.strip())
    except (ValueError, ZeroDivisionError):
        return None


def check_weights(values: Sequence[object], *, normalize: bool = False,
                  where: str = "weights", names: Sequence[str] | None = None,
                  error: type[Exception] = ValueError) -> list[Fraction]:
    """Exact weights summing to exactly 1.

    A vector whose sum is off by more than :data:`SUM_TOLERANCE` is refused unless
    ``normalize`` (then each weight is divided by the sum); nothing is renormalised silently.

    >>> check_weights([0.5, 0.3, 0.2])
    [Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)]
    >>> check_weights([1, 1, 2], normalize=True)
    [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)]
    >>> check_weights([0.5, 0.3], where="stage 'main'")
    Traceback (most recent call last):
    ...
    ValueError: stage 'main': weights sum to 0.8, not 1; fix them or ask for normalisation (normalize=True, or normalize = true in a mixture file)
    """
    label = (lambda i: f"source {names[i]!r}") if names else (lambda i: f"source {i}")
    ws = [parse_weight(v, f"{where}, {label(i)}", error=error) for i, v in enumerate(values)]
    if not ws:
        raise error(f"{where}: no weights given; a mixture needs at least one source")
    total = sum(ws, Fraction(0))
    if total == 0:
        raise error(f"{where}: every weight is 0; give at least one source a weight > 0")
    if total != 1:
        if not normalize and abs(total - 1) > SUM_TOLERANCE:
            raise error(
                f"{where}: weights sum to {float(total):.10g}, not 1; fix them or ask for "
                "normalisation (normalize=True, or normalize = true in a mixture file)")
        ws = [w / total for w in ws]
    return ws


def integer_weights(weights: Sequence[Fraction], *, where: str = "weights",
                    names: Sequence[str] | None = None,
                    error: type[Exception] = ValueError) -> tuple[list[int], int]:
    """Numerators over one denominator ``D <= MAX_DENOMINATOR`` (they sum to ``D``).

    Exact when the weights' common denominator fits; otherwise every weight is rounded to a
    multiple of ``1/MAX_DENOMINATOR`` (largest remainders, so the sum stays exact), an error
    of under 1e-9 per weight. A positive weight never rounds to 0: that is an error.

    >>> integer_weights([Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)])
    ([5, 3, 2], 10)
    """
    den = 1
    for w in weights:
        den = den * w.denominator // math.gcd(den, w.denominator)
        if den > MAX_DENOMINATOR:
            break
    if den <= MAX_DENOMINATOR:
        nums = [w.numerator * (den // w.denominator) for w in weights]
    else:
        den = MAX_DENOMINATOR
        scaled = [w * den for w in weights]
        nums = [math.floor(s) for s in scaled]
        short = den - sum(nums)
        by_remainder = sorted(range(len(nums)), key=lambda i: (-(scaled[i] - nums[i]), i))
        for i in by_remainder[:short]:
            nums[i] += 1
        for i, (w, m) in enumerate(zip(weights, nums)):
            if w > 0 and m == 0:
                label = f"source {names[i]!r}" if names else f"source {i}"
                raise error(
                    f"{where}, {label}: weight {float(w):.3g} is below the mixture's "
                    f"resolution 1/{MAX_DENOMINATOR}; give it 0 or a weight >= 1e-9")
    g = math.gcd(*nums) if any(nums) else 1
    return [m // g for m in nums], den // g


def fraction_text(w: Fraction) -> str:
    """An exact weight as JSON-friendly text: ``"3/10"``, or ``"1"`` for a whole number.

    >>> fraction_text(Fraction(3, 10)), fraction_text(Fraction(0))
    ('3/10', '0')
    """
    return str(w.numerator) if w.denominator == 1 else f"{w.numerator}/{w.denominator}"
