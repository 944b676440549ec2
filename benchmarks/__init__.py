"""The benchmark suites the docs cite (``docs/benchmarks.md``), run as modules of this package
from the checkout's root: ``python -m benchmarks.bench_loader --quick``, or all of them with
``python -m benchmarks.run_all``. No benchmark edits ``sys.path``
(``tests/unit/meta/test_benchmarks_layout.py``); a child process is started by
:func:`benchmarks.harness.run_child`.
"""
