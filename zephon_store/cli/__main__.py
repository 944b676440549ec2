"""``python -m zephon_store.cli``: the ``zephon`` command without the console script."""

from .main import entry

if __name__ == "__main__":
    entry()
