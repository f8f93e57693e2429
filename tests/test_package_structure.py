"""The package's shape (issue 25), checked with ``ast`` over the source of ``topi_bn`` and
``topi_bn.schedules`` (nothing is imported, so this runs in a second):

- at most :data:`MAX_LOCAL_IMPORTS` imports of the project's own modules inside function bodies
  (kept only for optional dependencies and the CLI's start-up time);
- no private name (``_x``) imported from another project module;
- no import circle among the project's modules at module level (imports under
  ``if TYPE_CHECKING:`` and inside functions do not count);
- every module over :data:`LONG` lines says why at its top: the first line of its docstring, or
  a comment right under the docstring, holds ``Long because: ...``.

Each check is a function of a ``{module name: source file}`` map, and the tests at the bottom
plant a violation in a small package of their own to show that each check can fail.

One test does import: :func:`topi_bn.deploy.run_library` with TVM's runtime alone (a board),
which is why ``deploy`` imports the compiler parts of topi-bn inside its functions.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

MAX_LOCAL_IMPORTS = 25
LONG = 500
REASON = "long because:"


# -- the project's modules -------------------------------------------------------------------
def package_dirs() -> dict[str, Path]:
    """``{package name: folder}`` of ``topi_bn`` and ``topi_bn.schedules``, found without
    importing them (``schedules/`` sits inside the installed package, beside it in a
    checkout: where ``topi_bn/__init__.py`` looks for it too)."""
    spec = importlib.util.find_spec("topi_bn")
    assert spec is not None and spec.origin, "topi_bn is not importable"
    pkg = Path(spec.origin).parent
    sched = pkg / "schedules"
    if not (sched / "__init__.py").is_file():
        sched = pkg.parent / "schedules"
    assert (sched / "rules.py").is_file(), f"no topi_bn.schedules source beside {pkg}"
    return {"topi_bn": pkg, "topi_bn.schedules": sched}


def modules_of(dirs: dict[str, Path]) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file under the package folders."""
    mods: dict[str, Path] = {}
    for name, root in dirs.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            dotted = ".".join([name, *parts])
            if name == "topi_bn" and parts[:1] == ["schedules"] and "topi_bn.schedules" in dirs:
                continue  # the installed copy of schedules/ is read under its own name
            mods[dotted] = path
    return mods


def _is_package(mods: dict[str, Path], module: str) -> bool:
    return mods[module].name == "__init__.py"


def _is_project(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").split(".")[0] == "topi_bn"


def _base(mods: dict[str, Path], module: str, node: ast.ImportFrom) -> str:
    """The absolute module name ``from <node.module>`` means in ``module``."""
    if not node.level:
        return node.module or ""
    base = module if _is_package(mods, module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def imported_modules(mods: dict[str, Path], module: str, node: ast.stmt) -> set[str]:
    """The project modules an import statement in ``module`` runs (a name imported from a
    package is the package, unless it is a submodule of it)."""
    out = set()
    if isinstance(node, ast.Import):
        out = {a.name for a in node.names if a.name.split(".")[0] == "topi_bn"}
    elif isinstance(node, ast.ImportFrom) and _is_project(node):
        base = _base(mods, module, node)
        out = {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
    return {m for m in out if m in mods and m != module}


def _module_level_imports(tree: ast.Module):
    """Import statements run when the module is imported: not in a function or class body's
    functions, not under ``if TYPE_CHECKING:``."""
    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list):
                        yield from visit(sub)
    yield from visit(tree.body)


def _trees(mods: dict[str, Path]) -> dict[str, ast.Module]:
    return {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}


# -- the checks --------------------------------------------------------------------------------
def function_local_imports(mods: dict[str, Path]) -> list[str]:
    """``"module:line"`` of each project import inside a function body."""
    found = []
    for module, tree in _trees(mods).items():
        seen = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if id(node) in seen:
                        continue
                    seen.add(id(node))
                    if (isinstance(node, ast.ImportFrom) and _is_project(node)) or (
                            isinstance(node, ast.Import)
                            and any(a.name.split(".")[0] == "topi_bn" for a in node.names)):
                        found.append(f"{module}:{node.lineno}")
    return sorted(found)


def private_imports(mods: dict[str, Path]) -> list[str]:
    """``"module:line name"`` of each private name imported from another project module."""
    found = []
    for module, tree in _trees(mods).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _is_project(node):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{module}:{node.lineno} {a.name}")
    return found


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules its module-level imports run. Importing ``a.b.c`` from
    outside ``a.b`` also runs the package ``a.b`` (not the top package ``topi_bn``, which every
    module's import runs first)."""
    graph = {}
    for module, tree in _trees(mods).items():
        edges = set()
        for node in _module_level_imports(tree):
            for target in imported_modules(mods, module, node):
                edges.add(target)
                parent = target.rpartition(".")[0]
                while parent.count(".") >= 1 and not module.startswith(parent + "."):
                    if parent in mods and parent != module:
                        edges.add(parent)
                    parent = parent.rpartition(".")[0]
        graph[module] = edges
    return graph


def import_cycles(mods: dict[str, Path]) -> list[list[str]]:
    """The strongly connected components (> 1 module, or a module importing itself) of
    :func:`import_graph` (Tarjan's algorithm, iterative)."""
    graph = import_graph(mods)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        cycles.append(sorted(comp))
    return cycles


def long_modules_without_reason(mods: dict[str, Path]) -> list[str]:
    """``"module (N lines)"`` of each module over :data:`LONG` lines that does not say why."""
    found = []
    for module, path in mods.items():
        src = path.read_text()
        lines = src.splitlines()
        if len(lines) <= LONG:
            continue
        tree = ast.parse(src)
        doc = ast.get_docstring(tree, clean=False) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        after = ""
        if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
                getattr(tree.body[0], "value", None), ast.Constant):
            end = tree.body[0].end_lineno
            after = lines[end] if end < len(lines) else ""
        elif lines:
            after = lines[0]
        if REASON not in first.lower() and not (
                after.lstrip().startswith("#") and REASON in after.lower()):
            found.append(f"{module} ({len(lines)} lines)")
    return sorted(found)


# -- the package ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def modules():
    mods = modules_of(package_dirs())
    assert {"topi_bn", "topi_bn.build", "topi_bn.schedules", "topi_bn.schedules.rules",
            "topi_bn.relax.registration"} <= set(mods)
    return mods


def test_few_function_local_project_imports(modules):
    found = function_local_imports(modules)
    assert len(found) <= MAX_LOCAL_IMPORTS, (
        f"{len(found)} project imports inside functions (at most {MAX_LOCAL_IMPORTS}: move "
        f"them to module level): {found}")


def test_no_private_name_imported_across_modules(modules):
    assert private_imports(modules) == []


def test_no_module_level_import_circle(modules):
    assert import_cycles(modules) == []


def test_long_modules_say_why(modules):
    assert long_modules_without_reason(modules) == [], (
        f"modules over {LONG} lines need a 'Long because: ...' line at the top (first "
        f"docstring line or a comment right under the docstring), or a split")


def test_run_library_imports_with_tvm_runtime_only():
    """``topi-bn run``'s library runner needs no TVM compiler (``TVM_USE_RUNTIME_LIB=1``: the
    runtime-only TVM of a board), so its module imports none of topi-bn's compiler parts."""
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    code = ("import tvm.base; assert tvm.base._RUNTIME_ONLY\n"
            "from topi_bn.deploy import run_library\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# -- the checks can fail ----------------------------------------------------------------------
def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "topi_bn"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_of({"topi_bn": root})


def test_checks_catch_planted_violations(tmp_path):
    many = "\n".join(f"def f{i}():\n    from .b import x\n    return x\n" for i in range(26))
    mods = _plant(tmp_path, {
        "a.py": "from .b import _hidden\n" + many,
        "b.py": "from .sub.c import y\nx = _hidden = 1\n",
        "sub/__init__.py": "from .c import y\n",
        "sub/c.py": "from topi_bn import b\ny = 2\n",
        "long.py": '"""A long module."""\n' + "z = 0\n" * 501,
        "said.py": '"""A long module."""\n# Long because: it must be.\n' + "z = 0\n" * 501,
        "lazy.py": "def f():\n    from . import a\n",
        "typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                          "    from . import typing_only2\n",
        "typing_only2.py": "from . import typing_only\n",
    })
    assert len(function_local_imports(mods)) == 27
    assert private_imports(mods) == ["topi_bn.a:1 _hidden"]
    assert import_cycles(mods) == [["topi_bn.b", "topi_bn.sub", "topi_bn.sub.c"]]
    assert long_modules_without_reason(mods) == ["topi_bn.long (502 lines)"]


def test_a_clean_package_passes(tmp_path):
    mods = _plant(tmp_path, {
        "a.py": "from .b import x\n",
        "b.py": "x = 1\ndef f():\n    from . import a\n",
        "sub/__init__.py": "from .c import y\n",
        "sub/c.py": "from topi_bn.b import x\ny = x\n",
    })
    assert len(function_local_imports(mods)) == 1
    assert private_imports(mods) == []
    assert import_cycles(mods) == []
    assert long_modules_without_reason(mods) == []
    assert os.path.basename(str(mods["topi_bn.sub"])) == "__init__.py"
