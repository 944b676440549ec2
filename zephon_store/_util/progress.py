"""Progress bars for the long commands (convert, verify, cache fill, gc): one implementation.

A bar is shown on a terminal and nowhere else: ``progress=None`` means "when stderr is a
terminal", ``False`` never (``--json``, scripts, logs), ``True`` always. Bars go to stderr
and are cleared when done (``leave=False``), so stdout holds only the command's result.

>>> show_progress(False), show_progress(True)
(False, True)
>>> with progress_bar(False, 3, "verify", unit="shard") as bar:   # off: prints nothing
...     bar.update(3)
"""

from __future__ import annotations

import sys

__all__ = ["progress_bar", "progress_note", "show_progress"]


def show_progress(progress: bool | None) -> bool:
    """``progress``, with None read as "stderr is a terminal"."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def progress_bar(progress: bool | None, total: int | None, desc: str, unit: str = "B"):
    """A tqdm bar on stderr counting ``unit`` up to ``total``, shown as :func:`show_progress`
    says. Bytes (``unit="B"``) print scaled (kB, MB); other counts print as whole numbers
    (scaled, tqdm would print ``1.00/9.00`` shards)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B",
                disable=not show_progress(progress), leave=False, file=sys.stderr)


def progress_note(progress: bool | None, desc: str):
    """One line on stderr while a step that has nothing to count runs (starting Ray
    takes seconds), cleared when it ends; shown as :func:`show_progress` says."""
    from tqdm import tqdm

    return tqdm(total=None, desc=desc, bar_format="{desc} ...",
                disable=not show_progress(progress), leave=False, file=sys.stderr)
