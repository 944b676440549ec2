"""``zephon audit --summary`` (issue 42 item 6): the consumption report of a real run, from
the audit's own count, against a brute-force tally of every batch the loaders handed out
(ids, and ``_masked`` for a deny list), grouped by what the test itself knows of each record
(its file, its url's host, its license)."""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from contextlib import redirect_stdout
from urllib.parse import urlsplit

import numpy as np
import pytest

from tests.helpers import two_stage_mixture
from zephon_store import BatchOptions, StopOptions, Topology
from zephon_store.cli.main import main
from zephon_store.order.order import OrderOptions

FILES, RECORDS = 3, 40
HOSTS = ["www.news.example", "blog.example.org", "news.example", "wiki.example"]
LICENSES = ["cc-by", "mit", "cc0"]
OPTS = OrderOptions(seed=4, window_blocks=2)


def _record(f: int, r: int) -> dict:
    i = f * RECORDS + r
    return {"text": f"doc {i}", "url": f"https://{HOSTS[i % 4]}/p/{i}?q=1",
            "license": LICENSES[(i // 7) % 3]}


def _dataset(root: str, files: int = FILES) -> str:
    import zephon_store as z

    os.makedirs(os.path.join(root, "raw"), exist_ok=True)
    for f in range(files):
        with open(os.path.join(root, "raw", f"part-{f}.jsonl"), "w") as fh:
            for r in range(RECORDS):
                fh.write(json.dumps(_record(f, r)) + "\n")
    return z.convert([os.path.join(root, "raw")], os.path.join(root, "ds"),
                     options=z.WriteOptions(row_group_rows=10), progress=False).url


def _run(dataset: str, log: str, deny: str | None) -> tuple[Counter, Counter]:
    """Two launches (W=1, B=8, 10 steps with ``deny``; then W=2, B=12, 8 steps, no list):
    ``(seen, masked)`` exposures per (source, id) as the batches handed them out."""
    from zephon_store.torch import ZephonLoader

    seen, masked = Counter(), Counter()

    def tally(b):
        src = b.get("_source", np.full(len(b["_seq"]), -1))
        m = b.get("_masked", np.zeros(len(b["_seq"]), dtype=bool))
        for s, i, hidden in zip(np.asarray(src).tolist(), np.asarray(b["_seq"]).tolist(),
                                np.asarray(m).tolist()):
            (masked if hidden else seen)[(s, i)] += 1

    first = ZephonLoader(dataset, topology=Topology(8), order=OPTS,
                         batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=10),
                         run_log=log, deny_list=deny)
    for b in first:
        tally(b)
    state = first.state_dict()
    for rank in range(2):
        loader = ZephonLoader(dataset, topology=Topology(12, world_size=2, rank=rank),
                              order=OPTS, batch=BatchOptions(with_seq=True),
                              stop=StopOptions(max_steps=8), run_log=log if rank == 0 else None)
        loader.load_state_dict(state)
        for b in loader:
            tally(b)
    return seen, masked


def _cli(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


def _expected(seen: Counter, masked: Counter, key_of, *, source=-1, tokens=None) -> dict:
    """Rows by key from the brute-force tallies: ids of ``source``, keyed by ``key_of(id)``."""
    rows: dict = {}
    n = FILES * RECORDS
    for i in range(n):
        row = rows.setdefault(key_of(i), Counter())
        s, m = seen[(source, i)], masked[(source, i)]
        row.update(samples=1, samples_seen=int(s > 0), exposures=s, masked=m)
    return {k: {"samples": r["samples"], "samples_seen": r["samples_seen"],
                "exposures": r["exposures"], "masked": r["masked"],
                "tokens": None if tokens is None else r["exposures"] * tokens,
                "documents": r["samples_seen"], "documents_whole": r["samples_seen"],
                "documents_part": 0, "documents_unseen": r["samples"] - r["samples_seen"], "epochs": round(r["exposures"] / r["samples"], 6)}
            for k, r in rows.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("consumption")
    url = _dataset(str(d))
    deny = d / "deny.json"
    deny.write_text(json.dumps({"ids": [5, 17, 99]}))
    log = str(d / "run.jsonl")
    seen, masked = _run(url, log, str(deny))
    return url, log, seen, masked


def test_the_summary_equals_a_tally_of_every_batch(run) -> None:
    url, log, seen, masked = run
    rc, out = _cli("audit", url, "--log", log, "--end-step", "18", "--summary",
                   "--by", "source,input,url,license", "--json")
    got = json.loads(out)
    assert rc == 0 and got["audit_ok"] and got["documents_known"] is True   # a record each
    assert got["steps"] == [0, 18] and got["positions"] == 10 * 8 + 8 * 12
    by = {dim: {r.pop("key"): r for r in rows} for dim, rows in got["by"].items()}
    assert by["source"] == _expected(seen, masked, lambda i: url)     # a dataset: its URL
    assert by["input"] == _expected(seen, masked, lambda i: f"part-{i // RECORDS}.jsonl")
    host = lambda i: urlsplit(_record(i // RECORDS, i % RECORDS)["url"]).hostname  # noqa: E731
    assert by["url"] == _expected(seen, masked,
                                  lambda i: host(i).removeprefix("www."))
    assert set(by["url"]) == {"news.example", "blog.example.org", "wiki.example"}
    assert by["license"] == _expected(seen, masked,
                                      lambda i: _record(i // RECORDS, i % RECORDS)["license"])
    assert sum(r["masked"] for r in by["source"].values()) == sum(masked.values()) > 0
    assert any("a sample is one input record" in n for n in got["notes"])


def test_markdown_holds_a_table_per_dimension(run) -> None:
    url, log, seen, _ = run
    rc, out = _cli("audit", url, "--log", log, "--end-step", "18", "--summary",
                   "--by", "url,license")
    assert rc == 0
    assert "## By domain" in out and "## By license" in out
    assert ("| domain | samples | samples_seen | exposures | masked | tokens | documents | "
            "documents_whole | documents_part | documents_unseen | epochs |") in out
    news = sum(n for (_, i), n in seen.items() if i % 4 in (0, 2))
    assert any(line.startswith("| news.example |") and f"| {news} |" in line
               for line in out.splitlines())


def test_sources_of_a_mixture(tmp_path) -> None:
    web = _dataset(str(tmp_path / "w"), files=1)
    code = _dataset(str(tmp_path / "c"), files=2)
    mix = two_stage_mixture(tmp_path / "mix.json", {"web": (web, [0.5, 0.2]),
                                                    "code": (code, [0.5, 0.8])})
    log = str(tmp_path / "mix.jsonl")
    seen, _ = _run(mix, log, None)
    rc, out = _cli("audit", mix, "--log", log, "--end-step", "18", "--summary", "--json",
                   "--by", "source,url")
    assert rc == 0
    got = json.loads(out)["by"]
    rows = {r["key"]: r for r in got["source"]}
    for k, name in enumerate(["web", "code"]):
        exposures = sum(n for (s, _), n in seen.items() if s == k)
        assert rows[name]["exposures"] == exposures > 0 and rows[name]["tokens"] is None
    # a domain both sources hold adds up over them
    assert sum(r["exposures"] for r in got["url"]) == sum(seen.values()) == 10 * 8 + 8 * 12


def test_tokens_and_documents_of_packed_windows(tmp_path) -> None:
    """A packed dataset with its document table: per source and per input, the documents
    read whole, in part and not at all, and their tokens, equal a scan of every document's
    spans against the windows the batches held."""
    from tests.integration.torchtitan_worker import make_packed_dataset
    from zephon_store.read.documents import open_documents

    packed = make_packed_dataset(str(tmp_path / "p"), seq_len=16, windows=300)
    log = str(tmp_path / "p.jsonl")
    seen, _ = _run(packed, log, None)
    rc, out = _cli("audit", packed, "--log", log, "--end-step", "18", "--summary", "--json")
    assert rc == 0
    got = json.loads(out)
    assert got["documents_known"] is True
    table = open_documents(packed)
    want: dict = {}
    for d in range(table.num_documents):
        doc = table.document(d)
        reads = [seen[(-1, s.window)] for s in doc.spans]
        for key in (packed, doc.input):
            row = want.setdefault(key, Counter())
            row["tokens"] += sum(n * s.length for n, s in zip(reads, doc.spans))
            kind = ("documents_unseen" if not any(reads) else "documents_whole"
                    if all(reads) else "documents_part")
            row[kind] += 1
    for dim in ("source", "input"):
        for row in got["by"][dim]:
            w = want[row["key"]]
            assert row["tokens"] == w["tokens"]
            for kind in ("documents_whole", "documents_part", "documents_unseen"):
                assert row[kind] == w[kind], (dim, row["key"], kind)
            assert row["documents"] == w["documents_whole"] + w["documents_part"]
    (src,) = got["by"]["source"]
    assert src["documents_part"] > 0 and src["documents_unseen"] > 0    # the run stopped early
    # The plain audit counts them too (documents seen whole, in part, not seen).
    rc, plain = _cli("audit", packed, "--log", log, "--end-step", "18", "--json")
    assert rc == 0 and json.loads(plain)["documents"] == [{"source": packed, **{
        k: want[packed][k] for k in ("documents_whole", "documents_part", "documents_unseen")}}]
    assert sum(r["tokens"] for r in got["by"]["input"]) == src["tokens"]


def test_refusals_are_one_line_usage_errors(run, capsys) -> None:
    url, log, _, _ = run
    assert _cli("audit", url, "--log", log, "--by", "url")[0] == 2
    assert "pass --summary with it" in capsys.readouterr().err
    assert _cli("audit", url, "--log", log, "--summary", "--by", "domain")[0] == 2
    err = capsys.readouterr().err
    assert "--by domain: no source holds a column 'domain'" in err and "has ['" in err
