"""The test suite, a package so that every test imports its helpers one way.

- ``unit/<layer>/``: fast and offline, one folder per layer of ``zephon_store`` (``util``,
  ``format``, ``order``, ``io``, ``ingest``, ``read``, ``write``, ``mix``, ``load``, ``runs``,
  ``torch``, ``grain``, ``cli``) and ``meta`` for the tests about the tree itself;
- ``integration/``: real servers and ``torchrun``;
- ``helpers/``: what tests share, imported as ``from tests.helpers import ...`` (corpora,
  small datasets, mixture files, ``ROOT``) or ``from tests.helpers.<module> import ...``
  (``stateful``, ``faultproxy``, ``gate``, ``node_start``).
"""
