#!/usr/bin/env bash
# Build a virtual environment with TorchTitan main (the Grain-era data pipeline) installed from
# a snapshot of its repository, for `make test-titan-main` (docs/torchtitan.md, "Tested versions").
#
#   scripts/titan_main_env.sh SNAPSHOT [VENV]
#
# SNAPSHOT is either a source tree of torchtitan (a folder holding its pyproject.toml) or a
# bare git directory of the repository; from a git directory the pinned commit $TITAN_COMMIT
# (default below: the commit this integration was tested on) is exported with `git archive`.
# VENV defaults to .venv-titan-main (git-ignored). Nothing but the package registries is
# reached: torch is installed FIRST at $TITAN_TORCH (2.13.0 by default) and pinned by a
# constraint for every later step, so pip never resolves torch; then the snapshot with
# --no-deps; then the snapshot's own [project].dependencies from PyPI; then zephon_store's
# runtime dependencies, with this checkout on the venv's path (a .pth file), so the venv
# always runs the working tree's code. Rerunning the script rebuilds the venv from scratch.
set -euo pipefail

TITAN_COMMIT="${TITAN_COMMIT:-b5bcd76c66d0acb1a08b176d9639425bc55e0b2a}"
TITAN_TORCH="${TITAN_TORCH:-2.13.0}"
PYTHON="${PYTHON:-python3}"

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 SNAPSHOT [VENV]  (SNAPSHOT: a torchtitan source tree or a bare git dir)" >&2
  exit 2
fi
SNAPSHOT="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${2:-$ROOT/.venv-titan-main}"

# The source: a tree as given, or the pinned commit of a git directory (checked before
# anything is removed or created).
if [ -f "$SNAPSHOT/pyproject.toml" ]; then
  TREE="$(cd "$SNAPSHOT" && pwd)"
  COMMIT="$(git -C "$TREE" rev-parse HEAD 2>/dev/null || echo unknown)"
elif git --git-dir="$SNAPSHOT" cat-file -e "$TITAN_COMMIT^{commit}" 2>/dev/null; then
  TREE=""
  COMMIT="$(git --git-dir="$SNAPSHOT" rev-parse "$TITAN_COMMIT^{commit}")"
else
  echo "$SNAPSHOT is neither a torchtitan source tree (no pyproject.toml) nor a git directory" \
       "holding commit $TITAN_COMMIT; fetch the repository or set TITAN_COMMIT" >&2
  exit 2
fi
if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
  echo "$VENV exists and is not a virtual environment; name another VENV" >&2
  exit 2
fi

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
SRC="${TREE:-$VENV/src/torchtitan}"
if [ -z "$TREE" ]; then
  mkdir -p "$SRC"
  # Only what the package build reads: a snapshot may lack large test assets (LFS-sized
  # blobs); git 2.39 then still prints "invalid object" for one and exits 0.
  git --git-dir="$SNAPSHOT" archive "$COMMIT" -- pyproject.toml README.md LICENSE \
      assets/version.txt torchtitan torchtitan_recipes | tar -x -C "$SRC"
fi

CONSTRAINTS="$VENV/constraints.txt"
echo "torch==$TITAN_TORCH" > "$CONSTRAINTS"
"${PIP[@]}" install "torch==$TITAN_TORCH"
"${PIP[@]}" install --no-deps "$SRC"
# The snapshot's own dependency list, read from its pyproject.toml (never guessed here).
mapfile -t DEPS < <("$VENV/bin/python" - "$SRC/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["dependencies"]))
EOF
)
mapfile -t ZEPHON_DEPS < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    project = tomllib.load(fh)["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["tokenize"]))
EOF
)
# pytest: the test file is also its torchrun worker (tests/integration/test_torchtitan_main.py).
"${PIP[@]}" install -c "$CONSTRAINTS" "${DEPS[@]}" "${ZEPHON_DEPS[@]}" pytest
# torchtitan.trainer (so Trainer.Config and the llama3 config registry) imports triton
# unconditionally (distributed/minimal_async_ep/kernels.py); CUDA machines have it.
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  "${PIP[@]}" install -c "$CONSTRAINTS" triton
fi
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT" > "$SITE/zephon_store_checkout.pth"

"$VENV/bin/python" - "$COMMIT" "$VENV/titan-main.json" <<'EOF'
import json, sys
import torch, torchtitan.components.data.loader  # noqa: F401  (main's data API is there)
from importlib.metadata import version
info = {"torchtitan_commit": sys.argv[1], "torchtitan": version("torchtitan"),
        "torch": torch.__version__, "grain": version("grain")}
with open(sys.argv[2], "w") as fh:
    json.dump(info, fh)
print("TorchTitan main env ready:", json.dumps(info))
EOF
