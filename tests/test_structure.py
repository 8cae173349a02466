"""The autograder's structure: subpackages by role that import one way, no import cycle, no
private name used across modules, no module over 600 lines, and every file the sandboxed side
imports copied into the sandbox.

Read from the source with `ast`, without importing anything: an import inside a function
counts as much as one at the top. Each subpackage's `__init__.py` ends its docstring with the
subpackages it may import (``It may import: core, isolation.``); the test holds every import to
that line, and the lines together to one direction (no cycle between subpackages). The package's
own top-level modules (`cli`, `commands`, `__init__`, `__main__`: the command-line interface) may
import every subpackage; no subpackage imports them.

Run as a script (``python tests/test_structure.py [FOLDER]``, autograder/ by default) it prints
the graph between the subpackages, what each module imports from the others, then anything the
tests would refuse; it exits 1 if there is something.

The sandboxed side (isolation/worker.py and the files beside it) is started as a script and
imports its neighbours as top-level modules (``import protocol``); those imports are edges of the
graph too, and `autograder.isolation.worker_files` must list every file they reach.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

COURSE = Path(__file__).resolve().parent.parent
PACKAGE = COURSE / "autograder"
MAP_PAGE = COURSE / "book" / "instructors" / "authoring.md"
MAP_HEADING = "## The repository at a glance"
TOP = "autograder"  # the name, in the graph, of the package's own top-level modules
MAX_LINES = 600
# One file per chapter, named by the exercise (autograder/hidden/test_KEY.py: `Assignment.hidden_tests`):
# a chapter's checks, their hints and their cases stay together where its author looks for them.
LONG_ALLOWED = re.compile(r"^hidden\.test_\d\d_\w+$")
SANDBOX = "isolation"  # the subpackage whose worker runs sandboxed
TEMPLATE_ONLY = {"isolation.warm_server"}  # reached from worker.py only in its --template branch
# Private names that other modules of the package may use, outside the sandbox and its worker:
# (module, name). They are to be made public where they are defined; any other use fails.
KNOWN_PRIVATE_USES: set = set()  # none today
MAY_IMPORT = re.compile(r"^It may import: (.*)\.\s*$", re.M)
# The course's own packages: what the wheel installs (autograder, solutions) and what the book runs
# from the checkout (coursebook). The grader may import the reference modules and nothing of the book's.
COURSE_PACKAGES = ("autograder", "solutions", "coursebook")
GRADER_MAY_IMPORT = {"solutions"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Package(dict):
    """{dotted module name: its parsed tree}, and which names are subpackages."""

    def __init__(self, trees: dict, subpackages: set[str]):
        super().__init__(trees)
        self.subpackages = sorted(subpackages)


@functools.lru_cache(maxsize=None)
def read_package(folder: Path = PACKAGE) -> Package:
    """Every module of the package (read once per folder: the trees are never changed), parsed, by its dotted name below the package: "cli",
    "core.text", "isolation.worker"; a subpackage's `__init__.py` is "core"; the package's own
    is "__init__"."""
    trees, subs = {}, set()
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        if len(parts) > 1:
            subs.add(parts[0])
            if parts[-1] == "__init__":
                parts = parts[:-1]
        trees[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return Package(trees, subs)


def subpackages(trees: Package) -> list[str]:
    return trees.subpackages


def subpackage(module: str, trees: Package) -> str:
    """The subpackage a module belongs to (TOP for the package's own top-level modules)."""
    return module.split(".")[0] if "." in module or module in trees.subpackages else TOP


def package_of(module: str, trees) -> str:
    """The package a module's relative imports start from ("" for the top)."""
    if "." not in module and module not in subpackages(trees):
        return ""
    return module if module in subpackages(trees) else module.rsplit(".", 1)[0]


def resolve(dotted: str, trees) -> str | None:
    """The module of the package a dotted path below it names, or the longest prefix that is one."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in trees:
            return name
        parts.pop()
    return None


def imported(tree: ast.Module, trees, here: str) -> list[tuple[str, ast.AST, list[str]]]:
    """(module, node, names imported from it) for each import of a module of the package in the
    module `here`: relative imports (``from . import x``, ``from ..core.text import y``),
    absolute ones (``import autograder.x.y``, ``from autograder.x import y``), and the sandboxed
    side's imports of its neighbours (``import protocol``, ``from device_check import f``)."""
    pkg = package_of(here, trees)
    out = []

    def add(dotted: str, node, names):
        module = resolve(dotted, trees)
        if module is None:
            return
        # ``from .x import y`` where y is a module itself: the edge is to y
        if names and dotted == module:
            subs = [f"{module}.{n}" if module != "" else n for n in names]
            if all(s in trees for s in subs):
                out.extend((s, node, []) for s in subs)
                return
        out.append((module, node, names if dotted == module else []))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            mod = node.module or ""
            if node.level:
                base = pkg.split(".") if pkg else []
                if node.level - 1 > len(base):
                    continue
                base = base[:len(base) - (node.level - 1)]
                dotted = ".".join(base + ([mod] if mod else []))
                if not dotted:
                    out.extend((n, node, []) for n in names if n in trees)
                else:
                    add(dotted, node, names)
            elif mod == "autograder":
                out.extend((n, node, []) for n in names if n in trees)
            elif mod.startswith("autograder."):
                add(mod[len("autograder."):], node, names)
            elif pkg and f"{pkg}.{mod.split('.')[0]}" in trees and subpackage(here, trees) == SANDBOX:
                add(f"{pkg}.{mod}", node, names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("autograder."):
                    add(alias.name[len("autograder."):], node, [])
                elif pkg and f"{pkg}.{alias.name.split('.')[0]}" in trees and subpackage(here, trees) == SANDBOX:
                    add(f"{pkg}.{alias.name}", node, [])
    return [(m, node, names) for m, node, names in out if m in trees]


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    return {name: {m for m, _, _ in imported(tree, trees, name) if m != name} for name, tree in trees.items()}


def subpackage_graph(graph: dict[str, set[str]], trees: Package) -> dict[str, set[str]]:
    """{subpackage: the other subpackages its modules import} (TOP for the top-level modules)."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(subpackage(module, trees), set()).update(subpackage(t, trees) for t in targets)
    return {s: targets - {s} for s, targets in out.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (each an import cycle), sorted."""
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


def declared(trees) -> dict[str, set[str]]:
    """{subpackage: the subpackages its `__init__.py` says it may import}; a subpackage whose
    docstring has no such line is missing from the result (and refused by `direction_problems`)."""
    out = {}
    for s in subpackages(trees):
        if s not in trees:
            continue  # no __init__.py: refused by `direction_problems`
        doc = ast.get_docstring(trees[s]) or ""
        found = MAY_IMPORT.findall(doc)
        if len(found) == 1:
            words = found[0].strip()
            out[s] = set() if words == "nothing of the package" else {w.strip() for w in words.split(",")}
    return out


def direction_problems(trees, graph) -> list[str]:
    """Each import from one subpackage into another that its `__init__.py` does not allow, each
    import of the top-level modules from a subpackage, each subpackage without its line, each name
    in a line that is no subpackage, and any cycle between the lines."""
    allowed = declared(trees)
    known = set(subpackages(trees))
    problems = [f"{s}/__init__.py: not there" if s not in trees else
                f"{s}/__init__.py: no line 'It may import: ...' in its docstring" for s in sorted(known - allowed.keys())]
    problems += [f"{s}/__init__.py: may import {sorted(a - known)}, which are no subpackages"
                 for s, a in sorted(allowed.items()) if a - known]
    problems += [f"the subpackages' lines make a cycle: {' <-> '.join(c)}" for c in cycles(allowed)]
    for module, targets in sorted(graph.items()):
        here = subpackage(module, trees)
        if here == TOP:
            continue
        for target in sorted(targets):
            there = subpackage(target, trees)
            if there == TOP:
                problems.append(f"{module} imports {target}: only the command-line interface may")
            elif there != here and there not in allowed.get(here, set()):
                problems.append(f"{module} imports {target}: {here} may not import {there}")
    return problems


def long_modules(folder: Path = PACKAGE) -> list[str]:
    """Each module of the package over MAX_LINES lines, but the chapters' hidden checks."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        name = ".".join(path.relative_to(folder).with_suffix("").parts)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and not LONG_ALLOWED.match(name):
            out.append(f"{path.relative_to(folder)}: {lines} lines")
    return out


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


def module_aliases(tree: ast.Module, trees, here: str) -> dict[str, str]:
    """{local name: module of the package} for the modules the module `here` imports as a whole
    (``from . import x as y``, ``from ..core import text``, ``import autograder.x.y as z``, the
    sandboxed side's ``import x``)."""
    aliases = {}
    for module, node, names in imported(tree, trees, here):
        if names:
            continue
        for a in node.names:
            last = a.name.split(".")[-1]
            if isinstance(node, ast.ImportFrom) and module.split(".")[-1] == a.name:
                aliases[a.asname or a.name] = module
            elif isinstance(node, ast.Import) and module.split(".")[-1] == last and (a.asname or "." not in a.name):
                aliases[a.asname or a.name] = module
    return aliases


def private_uses(trees: dict[str, ast.Module], known=frozenset()) -> list[str]:
    """Each use, in one module, of a private name of another: ``from .x import _y``, ``x._y`` on a
    module of the package, and a call ``anything._y(...)`` of a private name that only other
    modules of the package define (e.g. a private method of a class of theirs); not the uses
    `known` lists as (module, name)."""
    defined = {name: defined_names(tree) for name, tree in trees.items()}
    found = set()
    for name, tree in sorted(trees.items()):
        for module, node, names in imported(tree, trees, name):
            found |= {(name, node.lineno, n, f"imports {n} from {module}") for n in names if is_private(n)}
        aliases = module_aliases(tree, trees, name)
        elsewhere = set().union(*(d for other, d in defined.items() if other != name)) - defined[name]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, name) != name):
                found.add((name, node.lineno, node.attr, f"uses {aliases[node.value.id]}.{node.attr}"))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_private(node.func.attr)
                    and node.func.attr in elsewhere):
                found.add((name, node.lineno, node.func.attr, f"calls {node.func.attr}, private to another module"))
    return [f"{m}: line {line}: {what}" for m, line, n, what in sorted(found) if (m, n) not in known]


def repository_map(page: Path = MAP_PAGE) -> dict[str, tuple[str, set[str] | None, list[str]]]:
    """The map that opens the authoring page: {entry: (its text, the names after its arrow or None,
    its children's names)}; an entry is "book", "autograder", "autograder/core"... (no slash at the end)."""
    text = page.read_text(encoding="utf-8")
    block = text[text.index(MAP_HEADING):]
    block = block[block.index("```text\n") + len("```text\n"):]
    block = block[:block.index("```")]
    entries: dict[str, list] = {}
    top = current = None
    for line in block.splitlines():
        m = re.match(r"^( {0,2})(\S+)\s(.*)$", line)
        if m and not line.startswith("   "):
            name = m.group(2).rstrip("/")
            if m.group(1):
                name = f"{top}/{name}"
                entries[top][2].append(name.split("/")[-1])
            else:
                top = name
            arrow = line.find("\u2192")  # a list that goes on below goes on in the same column
            text, said = (line[len(m.group(1) + m.group(2)):arrow], line[arrow + 1:]) if arrow >= 0 else (m.group(3), "")
            current = entries.setdefault(name, [text.strip(), None, [], arrow, said.strip()])
        elif current is not None:
            arrow = current[3]
            left, right = (line[:arrow], line[arrow + 1:]) if arrow >= 0 else (line, "")
            current[0] = f"{current[0]} {left.strip()}".strip()
            current[4] = f"{current[4]} {right.strip()}".strip()
    for entry in entries.values():
        if entry[3] >= 0:
            entry[1] = set() if entry[4] == "nothing" else {w.strip() for w in entry[4].split(",") if w.strip()}
    return {name: (e[0], e[1], e[2]) for name, e in entries.items()}


def course_imports(folder: Path) -> set[str]:
    """The course's packages (COURSE_PACKAGES) that the modules under `folder` import."""
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found |= {n.split(".")[0] for n in names} & set(COURSE_PACKAGES)
    return found


def ignored_sources(root: Path = COURSE) -> list[str]:
    """The Python files of the course's packages and tests that git ignores: they would be missing
    from every clone (a subpackage whose `__init__.py` an output folder's rule hides still imports
    as a namespace package, and so breaks nothing until the wheel or a check reads it)."""
    out = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--",
                          *COURSE_PACKAGES, "tests"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if f.endswith(".py")]


def map_problems(trees: Package, page: Path = MAP_PAGE, root: Path = COURSE) -> list[str]:
    """Where the repository map disagrees with the tree: a folder it lists that is not there, a
    top-level folder or a subpackage it leaves out, a subpackage whose arrow differs from its
    `__init__.py`, a package of the course that imports another against its arrow (the grader:
    anything but `solutions`), a test folder it does not name."""
    entries = repository_map(page)
    problems = [f"the map lists {name}/, which is not a folder" for name in entries
                if not (root / name).exists()]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout.split()
    folders = {f.split("/")[0] for f in tracked if "/" in f and not f.startswith(".")}
    problems += [f"the map leaves out {f}/" for f in sorted(folders - entries.keys())]
    children = set(entries.get("autograder", ("", None, []))[2])
    problems += [f"the map leaves out autograder/{s}/" for s in sorted(set(trees.subpackages) - children)]
    allowed = declared(trees)
    for s in sorted(children & set(trees.subpackages)):
        said = entries[f"autograder/{s}"][1]
        if said != allowed.get(s):
            problems.append(f"the map says autograder/{s}/ may import {sorted(said or ())}; "
                            f"its __init__.py says {sorted(allowed.get(s, ()))}")
    for package in COURSE_PACKAGES:
        said = GRADER_MAY_IMPORT if package == "autograder" else entries.get(package, ("", None))[1]
        wrong = sorted(n for n in course_imports(root / package) - {package} if n not in (said or set()))
        if wrong:
            problems.append(f"{package}/ imports {', '.join(wrong)}; it may import {sorted(said or ()) or 'nothing'}")
    named = set(re.findall(r"([a-z_]+)/", entries.get("tests", ("",))[0])) | set(trees.subpackages)
    on_disk = {p.name for p in (root / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    problems += [f"the map does not name tests/{d}/" for d in sorted(on_disk - named)]
    return problems


def sandbox_closure(trees: dict[str, ast.Module], script: str, skip=frozenset()) -> set[str]:
    """The modules of the package that `script` imports, directly or not, not following `skip`."""
    seen, todo = {script}, [script]
    while todo:
        here = todo.pop()
        for module, _, _ in imported(trees[here], trees, here):
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
    assert cycles(subpackage_graph(graph, read_package())) == []


def test_the_subpackages_import_one_way():
    trees = read_package()
    assert direction_problems(trees, import_graph(trees)) == []


def test_the_command_line_interface_alone_knows_every_subpackage():
    trees = read_package()
    graph = subpackage_graph(import_graph(trees), trees)
    everything = set(subpackages(trees))
    reached, todo = set(), [TOP]
    while todo:
        for s in graph.get(todo.pop(), set()) - reached:
            reached.add(s)
            todo.append(s)
    assert reached == everything  # every subpackage serves the command line, directly or not
    assert [s for s in everything if graph.get(s, set()) >= everything - {s}] == []


def test_the_map_in_the_authoring_page_matches_the_tree():
    assert map_problems(read_package()) == []


def test_git_ignores_no_source_of_the_course():
    assert ignored_sources() == []


def test_no_module_is_over_600_lines():
    assert long_modules() == []


def test_no_private_name_is_used_across_modules():
    assert private_uses(read_package(), KNOWN_PRIVATE_USES) == []


def test_the_sandbox_gets_every_file_its_side_imports():
    from autograder.isolation.worker_files import TEMPLATE_FILES, WORKER_FILES

    trees = read_package()
    for files, skip in ((WORKER_FILES, TEMPLATE_ONLY), (TEMPLATE_FILES, frozenset())):
        names = [f"{SANDBOX}.{Path(f).stem}" for f in files]
        assert names[0] == f"{SANDBOX}.worker" and all(Path(f).parent == PACKAGE / SANDBOX for f in files)
        needed = sandbox_closure(trees, f"{SANDBOX}.worker", skip)
        assert needed <= set(names), f"not copied into the sandbox: {sorted(needed - set(names))}"
        for module in needed:
            assert package_imports(trees[module]) == [], f"{module} imports the autograder package"
    assert TEMPLATE_ONLY <= {f"{SANDBOX}.{Path(f).stem}" for f in TEMPLATE_FILES}


SYNTHETIC = {
    "__init__.py": "from .low import a\n",
    "cli.py": "from .low import a\nfrom .high import c\nfrom .isolation import worker\n",
    "low/__init__.py": '"""Low.\n\nIt may import: nothing of the package.\n"""\n',
    "low/a.py": "from . import b\n\ndef _hidden():\n    pass\n",
    "low/b.py": "from .a import _hidden\n",
    "high/__init__.py": '"""High.\n\nIt may import: low, isolation.\n"""\n',
    "high/c.py": "import autograder.low.a as A\nfrom .d import Pool\n\ndef f(p: Pool):\n    p._drain()\n    return A._hidden\n",
    "high/d.py": "from .. import cli\n\nclass Pool:\n    def _drain(self):\n        pass\n",
    "isolation/__init__.py": '"""The sandbox.\n\nIt may import: low, high.\n"""\n',
    "isolation/worker.py": "import sys\nimport helper\nfrom runner import Pool\n",
    "isolation/helper.py": "from ..low import a\n",
    "isolation/runner.py": "class Pool:\n    pass\n" + "x = 1\n" * MAX_LINES,
}


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check fails on a package made to break it."""
    pkg = tmp_path / "pkg"
    for name, source in SYNTHETIC.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(source)
    trees = read_package(pkg)
    graph = import_graph(trees)
    assert graph["isolation.worker"] == {"isolation.helper", "isolation.runner"}
    assert graph["high.c"] == {"low.a", "high.d"} and graph["cli"] == {"low.a", "high.c", "isolation.worker"}
    assert cycles(graph) == [["cli", "high.c", "high.d"], ["low.a", "low.b"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert subpackage_graph(graph, trees)["high"] == {"low", TOP}
    assert direction_problems(trees, graph) == [
        "the subpackages' lines make a cycle: high <-> isolation",
        "high.d imports cli: only the command-line interface may"]
    assert private_uses(trees) == ["high.c: line 5: calls _drain, private to another module",
                                   "high.c: line 6: uses low.a._hidden", "low.b: line 1: imports _hidden from low.a"]
    assert private_uses(trees, {("low.b", "_hidden"), ("high.c", "_drain")}) == ["high.c: line 6: uses low.a._hidden"]
    assert sandbox_closure(trees, "isolation.worker") == {"isolation.worker", "isolation.helper", "isolation.runner",
                                                          "low.a", "low.b"}
    assert sandbox_closure(trees, "isolation.worker", skip={"isolation.helper"}) == {"isolation.worker",
                                                                                      "isolation.runner"}
    assert package_imports(trees["isolation.helper"]) == [1] and package_imports(trees["isolation.worker"]) == []
    assert long_modules(pkg) == [f"isolation/runner.py: {MAX_LINES + 2} lines"]
    page = tmp_path / "map.md"
    page.write_text(f"{MAP_HEADING}\n\n```text\nsolutions/  references  \u2192 nothing\nnone/  not there\n"
                    "autograder/  the grader\n  low/   low  \u2192 nothing\n  high/  high, said wrongly  \u2192 low\n"
                    "    on two lines\ntests/  a folder per subpackage\n```\n")
    course = tmp_path / "course"
    for folder in ("tests/extra", "autograder/low", "autograder/high", "solutions"):
        (course / folder).mkdir(parents=True)
    (course / "solutions" / "ch01.py").write_text("import torch\nfrom coursebook.claims import claim\n")
    assert repository_map(page)["autograder/high"] == ("high, said wrongly on two lines", {"low"}, [])
    cont = tmp_path / "continued.md"  # a list of imports that goes on below, in the arrow's column
    cont.write_text(f"{MAP_HEADING}\n\n```text\nlow/  the low part  \u2192 core,\n{' ' * 21}isolation\n```\n")
    assert repository_map(cont)["low"] == ("the low part", {"core", "isolation"}, [])
    assert map_problems(trees, page, course) == [
        "the map lists none/, which is not a folder", "the map leaves out autograder/isolation/",
        "the map says autograder/high/ may import ['low']; its __init__.py says ['isolation', 'low']",
        "solutions/ imports coursebook; it may import nothing", "the map does not name tests/extra/"]
    subprocess.run(["git", "init", "-q", str(course)], check=True)
    (course / ".gitignore").write_text("grading/\n")
    (course / "autograder" / "grading").mkdir()
    (course / "autograder" / "grading" / "__init__.py").write_text("")
    assert ignored_sources(course) == ["autograder/grading/__init__.py"]
    (pkg / "low" / "__init__.py").write_text('"""Low, with no line."""\n')
    assert direction_problems(read_package.__wrapped__(pkg), graph)[0] == "low/__init__.py: no line 'It may import: ...' in its docstring"
    (pkg / "low" / "__init__.py").unlink()
    assert direction_problems(read_package.__wrapped__(pkg), graph)[0] == "low/__init__.py: not there"


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else PACKAGE
    trees = read_package(folder)
    graph = import_graph(trees)
    sub = subpackage_graph(graph, trees)
    allowed = declared(trees)
    print("Subpackages, and the others each imports (may import, as its __init__.py says):")
    for s in [TOP, *subpackages(trees)]:
        may = "anything" if s == TOP else ", ".join(sorted(allowed.get(s, ()))) or "nothing"
        print(f"  {s:<10} -> {', '.join(sorted(sub.get(s, ()))) or '(nothing of the package)'}   [may: {may}]")
    print("\nModules, and the modules of the package each imports:")
    width = max(map(len, graph))
    for name in sorted(graph, key=lambda m: (subpackage(m, trees) != TOP, m)):
        print(f"  {name:>{width}} -> {', '.join(sorted(graph[name])) or '(nothing of the package)'}")
    problems = [*(f"import cycle: {' <-> '.join(c)}" for c in cycles(graph) + cycles(sub)),
                *direction_problems(trees, graph), *private_uses(trees, KNOWN_PRIVATE_USES),
                *(f"over {MAX_LINES} lines: {m}" for m in long_modules(folder))]
    print("\nProblems:", len(problems) or "none")
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
