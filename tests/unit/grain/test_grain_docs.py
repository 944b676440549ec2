"""docs/grain.md's Python blocks run, in order, as one script: the JAX-style example (numpy
batches, no jax), the PyTorch one and the source example stay true to the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import ROOT

PAGE = os.path.join(ROOT, "docs", "grain.md")


def python_blocks(path: str) -> list[str]:
    """The ```python fenced blocks of ``path``, in order."""
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), flags=re.M | re.S)


def test_the_page_has_its_examples():
    code = "\n".join(python_blocks(PAGE))
    assert "ZephonSource(" in code and "ZephonIterDataset(" in code
    assert "import torch" in code and "import jax" not in code


def test_the_pages_python_blocks_run(tmp_path):
    script = tmp_path / "grain_md.py"
    script.write_text("\n\n".join(python_blocks(PAGE)) + '\nprint("ran")\n')
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip().endswith("ran")
