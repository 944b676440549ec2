"""Start and resume from S3, side by side with the peers: ``python -m benchmarks.start.run``
(``make bench-start``, docs/benchmarks_start.md)."""
