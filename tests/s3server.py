"""The SeaweedFS launcher for tests: one implementation, in ``tools/s3_server.py``.

Loaded by path because ``tools/`` is not a package; see that module for the flags and why.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                     "s3_server.py")
_NAME = "zephon_tools_s3_server"

if _NAME in sys.modules:
    _mod = sys.modules[_NAME]
else:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _mod  # dataclass/pickle lookups need the module registered
    _spec.loader.exec_module(_mod)

SeaweedServer = _mod.SeaweedServer
find_weed = _mod.find_weed
pick_ports = _mod.pick_ports

__all__ = ["SeaweedServer", "find_weed", "pick_ports"]
