"""The ``zephon`` command line. Entry point: :func:`zephon_store.cli.main.main`."""
