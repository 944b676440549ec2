"""No import circles in the package, and ``read/`` knows no ranks (issue 40).

Every import counts, function-level ones too: a circle hidden in a function is still two
modules that cannot be understood (or moved) apart. ``from pkg import mod`` names the
submodule, not the package's ``__init__``.
"""

from __future__ import annotations

import pathlib

from tests.unit.meta.test_layers import PKG, _imports, _modules


def _name(path: pathlib.Path) -> str:
    name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = {_name(p) for p in _modules()}
    graph = {}
    for path in _modules():
        out = set()
        for _, mod, names in _imports(path):
            subs = {f"{mod}.{n}" for n in names} & modules
            out |= subs or ({mod} & modules)
        graph[_name(path)] = out - {_name(path)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative).

    >>> circles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_circles() -> None:
    assert circles(_graph()) == []


def test_a_circle_is_found() -> None:
    """The check fails where it should: two modules importing each other, also through a
    third."""
    graph = _graph()
    graph["zephon_store.write.executors"].add("zephon_store.write.ray_engine")
    assert circles(graph) == [["zephon_store.write.executors", "zephon_store.write.ray_engine"]]
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_read_knows_no_ranks() -> None:
    """``read/`` imports nothing from ``load/`` (the run) or ``order/assign`` (who reads
    which position)."""
    graph = _graph()
    bad = {m: sorted(d for d in deps if d.startswith(("zephon_store.load",
                                                        "zephon_store.order.assign")))
           for m, deps in graph.items() if m.startswith("zephon_store.read")}
    assert not {m: d for m, d in bad.items() if d}
