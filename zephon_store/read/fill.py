"""Fill the decoded cache ahead of a job: decode a dataset's row groups, in order, into a
:class:`~zephon_store.read.decoded_disk.DecodedDiskCache` (``zephon cache fill`` prints the
:class:`FillReport`).

>>> import os
>>> report = fill_decoded_cache(tiny_dataset, os.path.join(tmp, "decoded"), budget_bytes=1 << 26)
>>> report.complete, report.filled, report.row_groups
(True, 10, 10)
>>> report.job_env["ZEPHON_DECODED_CACHE_DIR"] == report.decoded_dir
True
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from .._util.progress import progress_bar


@dataclass(frozen=True)
class FillReport:
    """What a fill did and how a job reads it: ``filled`` of ``row_groups`` are in the
    cache (``decoded`` now, ``present`` already there, ``dropped`` damaged entries replaced,
    ``bytes`` decoded), ``job_env`` is the environment a job needs to read the folder,
    ``jobs_here_read_it`` whether a job started from this environment would, and
    ``warning`` says why not."""

    url: str
    decoded_dir: str
    row_groups: int
    filled: int
    decoded: int
    present: int
    dropped: int
    bytes: int
    budget: int
    complete: bool
    job_env: dict[str, str]
    jobs_here_read_it: bool
    warning: str | None

    def to_dict(self) -> dict[str, Any]:
        """The report as ``zephon cache fill --json`` prints it (same keys, same order)."""
        return asdict(self)


def how_jobs_read(cache, budget_flag: int | None) -> tuple[dict[str, str], bool, str | None]:
    """The environment a job needs to read ``cache`` (a default loader reads a decoded
    cache only where ``$ZEPHON_DECODED_CACHE_DIR`` names it), whether a job started from
    this environment would, and a warning when it would not."""
    from .decoded_disk import ENV_BUDGET, ENV_DIR

    env = {ENV_DIR: cache.directory}
    if budget_flag is not None:
        # A job with a smaller budget would evict part of what was filled.
        env[ENV_BUDGET] = str(budget_flag)
    here = os.environ.get(ENV_DIR)
    usage = (f"set {ENV_DIR}={cache.directory} in the job's environment or pass "
             f"decoded_cache={cache.directory!r} to ZephonLoader/open_dataset")
    if not here:
        return env, False, (f"${ENV_DIR} is not set here, so a job started from this "
                            f"environment reads no decoded cache; {usage}")
    here = os.path.abspath(os.path.expanduser(here))
    if os.path.realpath(here) != os.path.realpath(cache.directory):
        return env, False, (f"${ENV_DIR} here names {here}, so a job started from this "
                            f"environment reads that folder, not {cache.directory} filled "
                            f"now; {usage}")
    return env, True, None


def fill_decoded_cache(url: str, decoded_dir: str | None = None, *,
                       budget_bytes: int | None = None, threads: int | None = None,
                       storage_options: dict | None = None,
                       progress: bool | None = False) -> FillReport:
    """Decode the row groups of ``url`` into the decoded cache at ``decoded_dir`` (default:
    ``$ZEPHON_DECODED_CACHE_DIR`` or the user cache's ``decoded`` folder), in order, until
    all are there or 90% of the budget is filled (beyond it, eviction would undo the fill).
    ``budget_bytes`` (default: ``$ZEPHON_DECODED_CACHE_BUDGET`` or 20 GiB) is also written
    into the report's ``job_env`` when given; ``threads`` defaults to one per core, at most 4.
    ``progress``: a bar of the row groups on stderr (None: when it is a terminal).

    >>> import os
    >>> fill_decoded_cache(tiny_dataset, os.path.join(tmp, "d"), threads=2).present
    0
    """
    from .dataset import open_dataset
    from .decoded_disk import DecodedDiskCache

    cache = DecodedDiskCache(decoded_dir, budget_bytes=budget_bytes)
    limit = int(cache.budget_bytes * 0.9)
    done = size = 0
    # One decode per core: more threads than cores cost far more system time than they
    # overlap (docs/benchmarks.md, "The decoded cache").
    threads = threads if threads is not None else min(4, os.cpu_count() or 1)
    # cache=False: a remote dataset's compressed bytes are not kept beside the decoded ones.
    with open_dataset(url, storage_options=storage_options, cache=False,
                      decoded_cache=cache) as ds, ThreadPoolExecutor(threads) as pool, \
            progress_bar(progress, ds.manifest.num_row_groups, "fill", "row group") as bar:
        rgs = ds.row_groups
        n = ds.manifest.num_row_groups
        while done < n and size <= limit:
            batch = range(done, min(n, done + threads))
            size += sum(t.nbytes for t in pool.map(lambda rg: rgs.read(rg, keep=False), batch))
            done += len(batch)
            bar.update(len(batch))
            bar.set_postfix(decoded=f"{size / 1e6:,.1f}MB")
        cached = sum(cache.contains(rgs.decoded_key(rg)) for rg in range(n))
    job_env, read_here, warning = how_jobs_read(cache, budget_bytes)
    return FillReport(url=url, decoded_dir=cache.directory, row_groups=n, filled=cached,
                      decoded=cache.stats.misses, present=cache.stats.hits,
                      dropped=cache.stats.corrupt, bytes=size, budget=cache.budget_bytes,
                      complete=cached == n, job_env=job_env, jobs_here_read_it=read_here,
                      warning=warning)
