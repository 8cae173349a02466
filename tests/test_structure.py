"""The autograder's module structure: no import cycle, no private name used across modules, and
every file the sandboxed side imports copied into the sandbox.

Read from the source with `ast`, without importing anything: an import inside a function
counts as much as one at the top. Run as a script (``python tests/test_structure.py [FOLDER]``,
autograder/ by default) it prints the import graph between the package's modules, then any
cycle and any cross-module use of a private name; it exits 1 if there is one.

The sandboxed side (worker.py and the files beside it) is started as a script and imports its
neighbours as top-level modules (``import protocol``); those imports are edges of the graph
too, and `autograder.worker_files` must list every file they reach.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
TEMPLATE_ONLY = {"warm_server"}  # reached from worker.py only in its --template branch
# Private names that other modules of the package may use, outside the sandbox and its worker:
# (module, name). They are to be made public where they are defined; any other use fails.
KNOWN_PRIVATE_USES: set = set()  # none today


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def read_package(folder: Path = PACKAGE) -> dict[str, ast.Module]:
    """Every module of the package folder (not its subpackages), parsed: {name: tree}."""
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(folder.glob("*.py"))}


def imported(tree: ast.Module, modules, package: str = "autograder") -> list[tuple[str, ast.AST, list[str]]]:
    """(module, node, names imported from it) for each import of a module of the package in `tree`:
    ``from . import x``, ``from .x import y``, ``import package.x``, ``from package import x``,
    ``from package.x import y``, and the sandboxed side's ``import x`` / ``from x import y``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 1 or (node.level == 0 and parts[:1] == [package]):
                rest = parts if node.level == 1 else parts[1:]
                if rest:
                    out.append((rest[0], node, names if len(rest) == 1 else []))
                else:
                    out.extend((n, node, []) for n in names)
            elif node.level == 0 and parts and parts[0] in modules:
                out.append((parts[0], node, names if len(parts) == 1 else []))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    out.append((parts[1], node, []))
                elif parts[0] in modules:
                    out.append((parts[0], node, []))
    return [(m, node, names) for m, node, names in out if m in modules]


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    return {name: {m for m, _, _ in imported(tree, trees) if m != name} for name, tree in trees.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each an import cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines anywhere: functions, classes, methods, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def module_aliases(tree: ast.Module, modules) -> dict[str, str]:
    """{local name: module of the package} for the modules `tree` imports as a whole
    (``from . import x as y``, ``import autograder.x as y``, the sandboxed side's ``import x``)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 and not node.module or
                                                 node.level == 0 and node.module == "autograder"):
            aliases.update((a.asname or a.name, a.name) for a in node.names if a.name in modules)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "autograder" and len(parts) == 2 and a.asname and parts[1] in modules:
                    aliases[a.asname] = parts[1]
                elif len(parts) == 1 and parts[0] in modules:
                    aliases[a.asname or a.name] = a.name
    return aliases


def private_uses(trees: dict[str, ast.Module], known=frozenset()) -> list[str]:
    """Each use, in one module, of a private name of another: ``from .x import _y``, ``x._y`` on a
    module of the package, and a call ``anything._y(...)`` of a private name that only other
    modules of the package define (e.g. a private method of a class of theirs); not the uses
    `known` lists as (module, name)."""
    defined = {name: defined_names(tree) for name, tree in trees.items()}
    found = set()
    for name, tree in sorted(trees.items()):
        for module, node, names in imported(tree, trees):
            found |= {(name, node.lineno, n, f"imports {n} from {module}") for n in names if is_private(n)}
        aliases = module_aliases(tree, trees)
        elsewhere = set().union(*(d for other, d in defined.items() if other != name)) - defined[name]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, name) != name):
                found.add((name, node.lineno, node.attr, f"uses {aliases[node.value.id]}.{node.attr}"))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_private(node.func.attr)
                    and node.func.attr in elsewhere):
                found.add((name, node.lineno, node.func.attr, f"calls {node.func.attr}, private to another module"))
    return [f"{m}.py:{line}: {what}" for m, line, n, what in sorted(found) if (m, n) not in known]


def sandbox_closure(trees: dict[str, ast.Module], script: str, skip=frozenset()) -> set[str]:
    """The modules of the package that `script` imports, directly or not, not following `skip`."""
    seen, todo = {script}, [script]
    while todo:
        for module, _, _ in imported(trees[todo.pop()], trees):
            if module not in seen and module not in skip:
                seen.add(module)
                todo.append(module)
    return seen


def package_imports(tree: ast.Module) -> list[int]:
    """Lines of imports that only work inside the package (relative, or of `autograder`)."""
    return [node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "autograder"))
            or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "autograder" for a in node.names))]


# --- the tests ----------------------------------------------------------------------------------

def test_no_import_cycle():
    graph = import_graph(read_package())
    assert cycles(graph) == []


def test_no_private_name_is_used_across_modules():
    assert private_uses(read_package(), KNOWN_PRIVATE_USES) == []


def test_the_sandbox_gets_every_file_its_side_imports():
    from autograder.worker_files import TEMPLATE_FILES, WORKER_FILES

    trees = read_package()
    for files, skip in ((WORKER_FILES, TEMPLATE_ONLY), (TEMPLATE_FILES, frozenset())):
        names = [Path(f).stem for f in files]
        assert names[0] == "worker" and all(Path(f).parent == PACKAGE for f in files)
        needed = sandbox_closure(trees, "worker", skip)
        assert needed <= set(names), f"not copied into the sandbox: {sorted(needed - set(names))}"
        for module in needed:
            assert package_imports(trees[module]) == [], f"{module}.py imports the autograder package"
    assert TEMPLATE_ONLY <= {Path(f).stem for f in TEMPLATE_FILES}


SYNTHETIC = {
    "a": "from . import b\n\ndef _hidden():\n    pass\n",
    "b": "from .a import _hidden\n",
    "c": "import autograder.a as A\nfrom .d import Pool\n\ndef f(p: Pool):\n    p._drain()\n    return A._hidden\n",
    "d": "class Pool:\n    def _drain(self):\n        pass\n\n    def drain_all(self):\n        self._drain()\n",
    "worker": "import sys\nimport helper\nfrom d import Pool\n",
    "helper": "from . import a\n",
}


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check fails on a package made to break it."""
    for name, source in SYNTHETIC.items():
        (tmp_path / f"{name}.py").write_text(source)
    trees = read_package(tmp_path)
    graph = import_graph(trees)
    assert graph["worker"] == {"helper", "d"} and graph["c"] == {"a", "d"}
    assert cycles(graph) == [["a", "b"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert private_uses(trees) == ["b.py:1: imports _hidden from a", "c.py:5: calls _drain, private to another module",
                                   "c.py:6: uses a._hidden"]
    assert private_uses(trees, {("b", "_hidden"), ("c", "_drain")}) == ["c.py:6: uses a._hidden"]
    assert sandbox_closure(trees, "worker") == {"worker", "helper", "d", "a", "b"}
    assert sandbox_closure(trees, "worker", skip={"helper"}) == {"worker", "d"}
    assert package_imports(trees["helper"]) == [1] and package_imports(trees["worker"]) == []


def main(argv: list[str]) -> int:
    trees = read_package(Path(argv[1]) if len(argv) > 1 else PACKAGE)
    graph = import_graph(trees)
    width = max(map(len, graph))
    for name in sorted(graph):
        print(f"{name:>{width}} -> {', '.join(sorted(graph[name])) or '(nothing of the package)'}")
    found, private = cycles(graph), private_uses(trees, KNOWN_PRIVATE_USES)
    print("import cycles:", "; ".join(" <-> ".join(c) for c in found) if found else "none")
    print("private names used across modules:", len(private) or "none")
    for line in private:
        print("  " + line)
    return 1 if found or private else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
