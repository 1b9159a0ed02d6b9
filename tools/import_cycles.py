"""Fail on an import cycle between modules of the product packages, imports under TYPE_CHECKING and
inside functions included.

    python tools/import_cycles.py                  # make lint: rljob_api, rljob_operator, rljob_runtime
    python tools/import_cycles.py PACKAGE...       # only these (importable) packages

The layers contracts in pyproject.toml keep the floors in order; a cycle inside one floor (two
modules of rollout/ that import each other, say) is what they cannot see. Each cycle prints as one
line, its modules joined by ``->`` back to the first, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grimp  # import-linter's graph builder

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rljob_api", "rljob_operator", "rljob_runtime")
SOURCE_ROOTS = ("api", "operator", "runtime")


def import_graph(packages: Sequence[str]) -> dict[str, set[str]]:
    """Each module of ``packages`` -> the modules of ``packages`` it imports directly."""
    graph = grimp.build_graph(*packages)
    inside = set(graph.modules)
    return {module: graph.find_modules_directly_imported_by(module) & inside for module in graph.modules}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    each sorted, in sorted order (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def describe(component: Sequence[str], edges: Mapping[str, set[str]]) -> str:
    """One path through the cycle, from its first module back to it."""
    members = set(component)
    start = component[0]
    # Breadth-first from start's imports back to start, inside the component.
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(edges.get(module, set()) & members):
                if target not in previous:
                    previous[target] = module
                    following.append(target)
        if start in previous:
            break
        frontier = following
    path = [start]
    node = previous[start]
    while node != start:
        path.append(node)
        node = previous[node]
    path.append(start)
    path[1:-1] = reversed(path[1:-1])
    return " -> ".join(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT / root) for root in SOURCE_ROOTS]
    edges = import_graph(args.packages)
    found = cycles(edges)
    for component in found:
        print(f"import cycle ({len(component)} modules): {describe(component, edges)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
