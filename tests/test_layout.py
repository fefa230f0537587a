"""The package's layout holds: folders by job in one order, no import circle between files or between folders, the
package root only the public surface, and no file of 600 lines or more.

The imports are read from the source (every ``import`` and ``from ... import`` statement, those inside functions
included), so that a lazy import cannot hide a circle. docs/architecture.md ("Layout") walks the same order.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trl_multiagent"

#: The folders from the bottom floor up: a folder may import only folders before it in this list (and itself).
#: ``errors.py`` is below all of them; ``testing.py``, ``__init__.py`` and ``__main__.py`` are the public surface.
ORDER = ["errors", "runtime", "metrics", "sandbox", "reward_blocks", "credit", "models", "generation", "environments",
         "team", "rollout", "evaluation", "verifier", "trainers", "command"]
PUBLIC_ROOT = {"__init__.py", "__main__.py", "errors.py", "testing.py"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports (a ``from X import y`` of a submodule ``y`` counts as X.y)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _folder(name: str) -> str:
    return name.split(".")[1] if name.count(".") else name


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_file_imports_itself_back_through_others():
    without_root = {k: v for k, v in GRAPH.items() if k != "trl_multiagent"}  # the root's lazy re-exports
    assert _circles(without_root) == []


def test_each_folder_imports_only_the_folders_below_it():
    rank = {name: i for i, name in enumerate(ORDER)}
    upward = []
    for name, targets in GRAPH.items():
        source = _folder(name)
        if source not in rank:  # the public surface (the root, testing.py) may import anything
            continue
        for target in targets:
            dest = _folder(target)
            if dest != source and dest in rank and rank[dest] > rank[source]:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_the_package_root_holds_only_the_public_surface():
    files = {p.name for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert files == PUBLIC_ROOT
    assert folders == set(ORDER) - {"errors"}
    for folder in folders:  # each says what lives there and what it may import
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        assert "import" in doc, folder


def test_no_file_reaches_600_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) >= 600}
    assert long == {}
