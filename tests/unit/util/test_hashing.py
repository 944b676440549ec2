"""xxh3_hex: one value whichever python-xxhash entry point hashes the bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash

from zephon_store._util.hashing import _RELEASE_GIL_BYTES, xxh3_file, xxh3_hex


@pytest.mark.parametrize("size", [0, 1, _RELEASE_GIL_BYTES - 1, _RELEASE_GIL_BYTES,
                                  _RELEASE_GIL_BYTES + 1, 3 << 20])
def test_xxh3_hex_matches_one_shot_on_both_sides_of_the_gil_threshold(size, tmp_path):
    data = os.urandom(size)
    want = xxhash.xxh3_128_hexdigest(data)
    assert xxh3_hex(data) == want
    assert xxh3_hex(bytearray(data)) == want
    assert xxh3_hex(memoryview(data)) == want
    p = tmp_path / "f"
    p.write_bytes(data)
    assert xxh3_file(str(p)) == want


def test_xxh3_hex_of_a_slice_and_of_a_wide_view_hashes_the_bytes():
    data = os.urandom(_RELEASE_GIL_BYTES * 3)
    view = memoryview(data)[7:7 + 2 * _RELEASE_GIL_BYTES]
    assert xxh3_hex(view) == xxhash.xxh3_128_hexdigest(bytes(view))
    # A view of 8-byte items: the size test counts bytes, not items.
    wide = memoryview(np.frombuffer(data, dtype=np.int64))
    assert xxh3_hex(wide) == xxhash.xxh3_128_hexdigest(data)


def test_is_hex_hash_is_a_whole_string_match():
    from zephon_store._util.hashing import is_hex_hash

    h = "0" * 32
    assert is_hex_hash(h)
    assert not is_hex_hash(h + "\n") and not is_hex_hash(h + "0") and not is_hex_hash(None)


def test_xxh3_ranges_matches_slices_across_read_blocks(tmp_path, monkeypatch):
    """The file's hash and each range's equal one-shot hashes of the slices, for ranges that
    start, end and lie inside a read block, span several blocks, touch each other, leave gaps,
    and are empty."""
    from zephon_store._util import hashing

    monkeypatch.setattr(hashing, "_CHUNK", 1000)   # many blocks on a small file
    data = os.urandom(5500)
    p = tmp_path / "f"
    p.write_bytes(data)
    ranges = [(0, 4), (4, 999), (999, 1001), (1200, 3700), (3700, 3700), (4000, 5000),
              (5000, 5500)]
    whole, parts = hashing.xxh3_ranges(str(p), ranges)
    assert whole == xxh3_hex(data)
    assert parts == [xxh3_hex(data[a:b]) for a, b in ranges]
