"""The format grid (issue 32): codec, data page size and row-group size, measured per corpus.

``python -m benchmarks.format`` (``make bench-format``) converts each corpus once per grid
cell and measures it in fresh processes; ``docs/benchmarks_format.md`` is its report.
"""
