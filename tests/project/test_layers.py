"""The house by stage: imports flow one way (import-linter's contracts in pyproject.toml) and no module imports
itself back through others (a circle), function-level imports included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _imports(path: Path, package: str) -> set[str]:
    """Every oneknob module a file imports, at any depth in the file (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("oneknob")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("oneknob"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (SRC / "oneknob").rglob("*.py")}
    return {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    graph = _graph()
    assert len(graph) > 40  # the walk found the package
    assert _circles(graph) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_import_contracts_hold():
    """import-linter's contracts (pyproject.toml): stages import downwards only, the verdict stays pure, the
    engine registry names engines without importing them."""
    linter = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True, cwd=SRC.parent, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def _named_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every `from oneknob... import name` in a file, at any depth."""
    return [(node.lineno, node.module, alias.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("oneknob")
            for alias in node.names]


def _missing(paths: list[Path], root: Path) -> list[str]:
    """"file:line: module has no name" for each named import from oneknob that does not resolve."""
    import importlib

    missing = []
    for path in paths:
        for line, module, name in _named_imports(path):
            found = importlib.import_module(module)
            submodule = hasattr(found, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
            if not hasattr(found, name) and not submodule:
                missing.append(f"{path.relative_to(root)}:{line}: {module} has no {name}")
    return missing


def test_what_benchmarks_and_scripts_import_from_oneknob_exists():
    """The code outside src/ that no test runs (make bench, make mutate's report, the UI screenshot) imports
    names that still exist where it imports them from: a name moved to another module broke make bench once."""
    root = SRC.parent
    files = sorted((root / "benchmarks").glob("*.py")) + sorted((root / "scripts").glob("*.py")) + [root / "run.py"]
    assert len(files) > 10 and _missing(files, root) == []


def test_the_import_check_finds_a_missing_name(tmp_path):
    (tmp_path / "bench.py").write_text("def f():\n    from oneknob.record.tracking import JournaledTracker, Tracker\n"
                                       "from oneknob.record import journaled\n")
    assert _missing([tmp_path / "bench.py"], tmp_path) == [
        "bench.py:2: oneknob.record.tracking has no JournaledTracker"]


def _is_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_uses(paths: list[Path], root: Path) -> list[str]:
    """"file:line: module._name" for each private name (one leading underscore) a module of src/ takes from another
    oneknob module: `from oneknob.x import _name`, or `_name` read off a module it imported (`x._name`). A name two
    modules share is the owner's public API, or belongs with the one module that uses it."""
    found = []
    for path in paths:
        own = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        modules = {}  # local name -> the oneknob module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {(a.asname or a.name): a.name for a in node.names if a.asname and
                            a.name.startswith("oneknob.")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("oneknob"):
                for alias in node.names:
                    if _is_module(f"{node.module}.{alias.name}", root):
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif alias.name.startswith("_") and not alias.name.startswith("__") and node.module != own:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and modules[node.value.id] != own):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_no_module_takes_a_private_name_from_another():
    """Across packages and within one: what another module needs of a module is in its public names. (Tests may
    reach into the module they test.)"""
    paths = sorted((SRC / "oneknob").rglob("*.py"))
    assert len(paths) > 40 and private_uses(paths, SRC) == []


def test_the_private_name_check_finds_both_spellings(tmp_path):
    (tmp_path / "oneknob" / "record").mkdir(parents=True)
    for name in ("__init__.py", "record/__init__.py", "record/tracking.py"):
        (tmp_path / "oneknob" / name).write_text("def _retry(): pass\n")
    (tmp_path / "oneknob" / "cli.py").write_text(
        "from oneknob.record.tracking import _retry, Tracker\nfrom oneknob.record import tracking\n"
        "def f():\n    return tracking._retry, tracking.__name__, tracking.Tracker\n")
    (tmp_path / "oneknob" / "record" / "tracking.py").write_text(
        "from oneknob.record.tracking import _retry\n")  # its own private name: fine
    assert private_uses(sorted((tmp_path / "oneknob").rglob("*.py")), tmp_path) == [
        "oneknob/cli.py:1: oneknob.record.tracking._retry", "oneknob/cli.py:4: oneknob.record.tracking._retry"]
