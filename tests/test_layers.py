"""The one-way layers: import-linter's contracts (pyproject.toml) hold, they catch an upward import, and no
two modules of src/ import each other even through imports inside functions."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
                           "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_layer_contracts_hold():
    done = lint_imports(ROOT, SRC)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_the_contracts(tmp_path):
    shutil.copytree(SRC / "specrank", tmp_path / "src" / "specrank", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    select = tmp_path / "src" / "specrank" / "selection" / "select.py"
    select.write_text(select.read_text() + "\n\ndef upward():\n    from specrank.commands import args  # noqa\n")
    done = lint_imports(tmp_path, tmp_path / "src")
    assert done.returncode != 0
    assert "specrank.selection is not allowed to import specrank.commands" in done.stdout


def module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if package else parts), package


def imported(module: str, package: bool, node, modules: set[str]) -> set[str]:
    """The src modules an import statement runs (the module, and packages above it not above ``module``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if package else module.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name not in modules:
            continue
        out.add(name)
        while "." in name:
            name = name.rsplit(".", 1)[0]
            if not (module == name or module.startswith(name + ".")):
                out.add(name)
    return out - {module}


def import_graph() -> dict[str, set[str]]:
    files = {module_of(p): p for p in SRC.rglob("*.py")}
    modules = {m for m, _ in files}
    graph = {}
    for (module, package), path in files.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):  # every import, inside functions too
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= imported(module, package, node, modules)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_src_modules():
    graph = import_graph()
    assert "specrank.decode.core" in graph and graph["specrank.decode.runs.recorder"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# Imports of specrank inside functions: each needs a reason (an optional library such as MLflow, Ray, Optuna,
# LightGBM or gguf, or a heavy start-up such as numba's), said in a comment on its line or the line above.
FUNCTION_IMPORTS_LIMIT = 30


def function_imports(source: str) -> list[int]:
    """Line numbers of the imports of specrank (absolute or relative) made inside a function or lambda."""
    found = []

    def visit(node, inside: bool):
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.ImportFrom) and (child.level or (child.module or "").startswith(
                    "specrank")):
                found.append(child.lineno)
            elif inside and isinstance(child, ast.Import) and any(a.name.split(".")[0] == "specrank"
                                                                   for a in child.names):
                found.append(child.lineno)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def has_reason(lines: list[str], lineno: int) -> bool:
    """A comment other than a linter's on the import's line or alone on the line above."""
    def comment(text: str) -> str:
        return text.split("#", 1)[1].strip() if "#" in text else ""

    here, above = comment(lines[lineno - 1]), lines[lineno - 2].strip() if lineno > 1 else ""
    return bool(here and not here.startswith("noqa")) or (above.startswith("#") and len(above) > 2)


def test_function_imports_are_found_once_with_their_reasons():
    source = ("import specrank.x\n\ndef f():\n    from specrank import a  # numba: only when scoring\n"
              "    def g():\n        # mlflow: optional\n        from . import b\n        import specrank.c\n"
              "    import os\n    from specrank import d  # noqa: F401\n")
    assert function_imports(source) == [4, 7, 8, 10]
    lines = source.splitlines()
    assert [has_reason(lines, n) for n in (4, 7, 8, 10)] == [True, True, False, False]


def test_few_imports_of_specrank_inside_functions_each_with_its_reason():
    src = SRC / "specrank"
    counted, unexplained = [], []
    for path in sorted(src.rglob("*.py")):
        name = path.relative_to(src).as_posix()
        lines = path.read_text().splitlines()
        for lineno in function_imports(path.read_text()):
            counted.append(f"{name}:{lineno}")
            if not has_reason(lines, lineno):
                unexplained.append(f"{name}:{lineno}: {lines[lineno - 1].strip()}")
    assert len(counted) <= FUNCTION_IMPORTS_LIMIT, counted
    assert unexplained == []


def test_listing_the_commands_imports_none_of_them():
    code = ("import sys, contextlib, io\nfrom specrank.cli import COMMANDS, main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n    assert main(['--help']) == 0\n"
            "assert all(name in out.getvalue() for name in COMMANDS)\n"
            "print(sorted(m for m in sys.modules if m.startswith('specrank.commands') or m in ('torch', 'pandas')))")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(SRC)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
