"""Integrations with training frameworks; importing this package imports none of them.

- :mod:`zephon_store.integrations.torchtitan`: ``ZephonDataLoader``, a TorchTitan dataloader
  whose checkpoint is one replicated cursor (resume on any number of GPUs), and the
  ``zephon_llama3_debug`` config function (``--module zephon_store.integrations.torchtitan``).
- :mod:`zephon_store.integrations.torchtitan_override`: ``use_zephon``, a TorchTitan override
  (``--override.imports zephon_store.integrations.torchtitan_override.use_zephon``).
- :mod:`zephon_store.integrations.titan_batches`: token windows -> TorchTitan batches.

The TorchTitan modules need the ``torchtitan`` extra (``pip install 'zephon_store[torchtitan]'``);
see ``docs/torchtitan.md``.
"""
