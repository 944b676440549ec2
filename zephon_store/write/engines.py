"""The conversion's engines by name: :func:`make_executor` (``"local"`` or ``"ray"``).

The executor seam is :mod:`zephon_store.write.executors`; each engine implements it
(:class:`~zephon_store.write.executors.LocalExecutor`,
:class:`~zephon_store.write.ray_engine.RayExecutor`), and this module, above both, chooses.
"""

from __future__ import annotations

from ..errors import require
from .executors import Executor, LocalExecutor
from .ray_engine import RayExecutor, check_ray_address

__all__ = ["ENGINES", "make_executor"]

#: The engines :func:`make_executor` knows.
ENGINES = ("local", "ray")


def make_executor(engine: str = "local", *, workers: int | None = None,
                  ray_address: str | None = None, verbose: bool = False) -> Executor:
    """The executor for ``engine``: ``"local"`` (``workers`` processes, default 1) or ``"ray"``
    (``workers`` tasks at once, default: the cluster's CPUs; ``ray_address`` joins an existing
    cluster, else a local Ray instance is started; ``verbose`` shows Ray's own log lines).

    A ``ray_address`` where no Ray cluster answers raises
    :class:`~zephon_store.errors.RayAddressError` here, within seconds, so a conversion
    fails before it writes anything (Ray's own connect retries for minutes).

    >>> make_executor("local", workers=2).workers
    2
    >>> make_executor("spark")
    Traceback (most recent call last):
    ...
    ValueError: engine must be one of local, ray; got 'spark'
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if engine == "local":
        if ray_address is not None:
            raise ValueError("ray_address is for engine='ray'; pass engine='ray' or drop it")
        return LocalExecutor(workers or 1)
    require("ray", "ray")
    if ray_address is not None:
        check_ray_address(ray_address)
    return RayExecutor(workers=workers, address=ray_address, verbose=verbose)
