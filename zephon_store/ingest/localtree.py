"""Local input trees: walks and globs that follow symbolic links, with loops refused.

fsspec's local ``find``/``glob`` list a link to a folder as a file of type ``other`` and never
descend into it, while real corpora are full of linked folders. Here every link is followed;
a link that leads back to a folder holding it is an error (it would never end), and a file
reached under two names (two links to one folder) is one input, kept under its first name.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator

from fsspec.utils import glob_translate

from ..errors import InputError

HIDDEN = (".", "_")
Found = tuple[str, int, tuple[int, int]]  # (path, size, (st_dev, st_ino))


MAGIC = re.compile(r"[*?\[]")


def walk(root: str) -> list[Found]:
    """Every file below the folder ``root``, links followed; names starting with '.' or '_'
    are skipped at any depth below ``root``."""
    return [take(*entry) for entry in _entries(root, max_depth=None, prune_hidden=True)
            if entry[1] != "dir"]


def glob(pattern: str) -> list[Found]:
    """Files matching ``pattern`` (``*``, ``?``, ``[...]``, ``**``), links followed; a matched
    folder is walked. Hidden names are dropped as :func:`hidden_below_glob` says."""
    parts = pattern.split("/")
    first = next(i for i, p in enumerate(parts) if MAGIC.search(p))
    base = "/".join(parts[:first]) or "/"
    if not os.path.isdir(base):
        return []
    depth = None if "**" in pattern else len(parts) - first
    regex = re.compile(glob_translate(pattern))
    out: list[Found] = []
    for path, kind, found in _entries(base, max_depth=depth, prune_hidden=False):
        if not regex.match(path) or hidden_below_glob(path, pattern):
            continue
        out.extend(walk(path) if kind == "dir" else [take(path, kind, found)])
    return out


def hidden_below_glob(name: str, pattern: str) -> bool:
    """True when a path component matched by a wildcard starts with '.' or '_' (shell-like)."""
    pat_parts, parts = pattern.split("/"), name.split("/")
    first_magic = next((i for i, p in enumerate(pat_parts) if MAGIC.search(p)), len(pat_parts))
    aligned = "**" not in pattern and len(pat_parts) == len(parts)
    for i in range(first_magic, len(parts)):
        if parts[i].startswith(HIDDEN):
            if not (aligned and pat_parts[i].startswith(parts[i][0])):
                return True
    return False


def take(path: str, kind: str, found: Found | None = None) -> Found:
    """The file ``path`` of ``kind`` as found; a broken link or a special file raises (each
    would be a silently missing input), so they fail only when selected."""
    if kind == "file" and found is None:
        st = os.stat(path)
        found = (path, st.st_size, (st.st_dev, st.st_ino))
    if kind == "broken":
        raise InputError(f"{path}: broken symbolic link to {os.readlink(path)} (nothing is "
                         f"there); fix or remove the link", path=path)
    if kind == "special":
        raise InputError(f"{path}: not a regular file or folder (a FIFO, socket or device); "
                         f"move it out of the input folder", path=path)
    assert found is not None
    return found


def _entries(root: str, *, max_depth: int | None,
             prune_hidden: bool) -> Iterator[tuple[str, str, Found | None]]:
    """``(path, kind, found)`` for every entry below ``root``; kind is ``file`` (``found``
    set), ``dir``, ``broken`` (a link to nothing) or ``special``."""
    st = os.stat(root)
    # Each folder carries the (dev, inode) -> path of the folders above it, to spot loops.
    stack: list[tuple[str, int, dict[tuple[int, int], str]]] = [
        (root, 0, {(st.st_dev, st.st_ino): root})]
    while stack:
        folder, depth, above = stack.pop()
        if max_depth is not None and depth >= max_depth:
            continue
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in reversed(entries):
            if prune_hidden and entry.name.startswith(HIDDEN):
                continue
            path = entry.path
            try:
                st = entry.stat()  # follows links
            except FileNotFoundError:
                yield path, "broken", None
                continue
            key = (st.st_dev, st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                if key in above:
                    raise InputError(
                        f"{path}: symbolic link loop: it leads back to {above[key]}, a folder "
                        f"that holds it; remove the link, or name the folders to read "
                        f"separately", path=path)
                yield path, "dir", None
                stack.append((path, depth + 1, {**above, key: path}))
            elif stat.S_ISREG(st.st_mode):
                yield path, "file", (path, st.st_size, key)
            else:
                yield path, "special", None
