"""Zephon from a table already in memory: the raw writer's starting point (issue 43).

The corpus is read into one Arrow table before the clock, as for raw pyarrow
(``sys_pyarrow.prepare_convert``, without its byte planes: Zephon makes its own). The clock
times what a user holding that table does: write it as an Arrow IPC file (about a memory
copy) and ``zephon_store.convert`` that file (default options), so the ratio against raw
pyarrow compares two writers that start from the same table. Only conversion is measured
(``benchmarks/bench_convert.py``); its reads would be ``sys_zephon``'s.
"""

from __future__ import annotations

import os


def prepare_convert(kind: str, inp: str):
    """The input as one Arrow table in memory (untimed)."""
    from .sys_pyarrow import _read_input

    return _read_input(kind, inp).combine_chunks()


def convert(kind: str, inp: str, out: str, workers: int = 1, prepared=None) -> dict:
    import pyarrow as pa

    from zephon_store import convert as zconvert

    table = prepared if prepared is not None else prepare_convert(kind, inp)
    ipc = out + ".input.arrow"   # beside the output: never read as an input of another case
    with pa.ipc.new_file(ipc, table.schema) as w:
        w.write_table(table)
    try:
        r = zconvert([ipc], out, workers=workers, progress=False)
    finally:
        os.remove(ipc)
    return {"stages": r.stages, "work": r.work_seconds}
