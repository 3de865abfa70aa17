"""The documentation cannot drift: the site builds with --strict, every command a page marks as runnable runs
as shown, and every module or source path named in docs/, conf/, experiments/ and README.md exists.

A page marks a runnable block with `<!-- docs-test: runs -->` (or `<!-- docs-test: runs, exit N -->`) on the line
before its fenced block (docs/development.md says so to contributors). The marked blocks of one page run in order
in one fresh directory, as a reader following the page runs them.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import RUN_PY, run_python, seed_store

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARK = re.compile(r"^<!-- docs-test: runs(?:, exit (\d+))? -->$")
FENCE = re.compile(r"^```")


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    """mkdocs build --strict (never -q: mkdocs counts the warnings it logs, and -q logs none, so it passes)."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    return subprocess.run([str(mkdocs), "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=config.parent,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


def test_the_site_builds_strict(tmp_path):
    """`make docs`: mkdocs-material, every page in the nav, every link and anchor found (offline: the theme's
    assets ship in its wheel)."""
    done = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "guides" / "knobs" / "index.html")


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    """The strictness is the site's own settings (mkdocs.yml's validation), checked on a two-page site."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guides/missing.md).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    small = {k: config[k] for k in ("strict", "theme", "markdown_extensions", "validation")}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small | {"site_name": "t", "nav": [{"Home": "index.md"}]}))
    done = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 1
    assert "guides/missing.md" in done.stderr and "orphan.md" in done.stderr, done.stderr[-3000:]


def marked_blocks(page: Path) -> list[tuple[int, int, list[str]]]:
    """(line, expected exit code, commands) of each marked block of a page; a command's `\\` continuations are
    joined and its comment dropped."""
    lines = page.read_text().splitlines()
    blocks = []
    for n, line in enumerate(lines):
        mark = MARK.match(line.strip())
        if not mark:
            continue
        assert n + 1 < len(lines) and FENCE.match(lines[n + 1]), f"{page}:{n + 1}: the mark needs a fenced block"
        body, i = [], n + 2
        while not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        blocks.append((n + 1, int(mark.group(1) or 0), [c for c in _joined(body) if c.strip()]))
    return blocks


def _joined(body: list[str]) -> list[str]:
    commands, current = [], ""
    for line in body:
        current += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            commands.append(current)
            current = ""
    return commands


def argv_of(command: str) -> list[str]:
    """A shown command as the project's interpreter runs it: `python` is sys.executable, `run.py` the repository's."""
    words = shlex.split(command, comments=True)
    assert words[0] in ("python", ".venv/bin/python"), f"{command!r}: a runnable command starts with python"
    args = words[1:]
    if args[0] == "run.py":
        args[0] = str(RUN_PY)
    return args


def needs_no_vllm(argv: list[str]) -> bool:
    if argv[:2] == ["-m", "oneknob"]:
        return True
    return argv[0] == str(RUN_PY) and ("engine=synthetic" in argv or argv[1:] == ["--help"])


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not p.is_symlink()) + [ROOT / "README.md"]


RUNNABLE = [p for p in _pages() if marked_blocks(p)]


def test_pages_mark_runnable_commands():
    assert len(RUNNABLE) >= 4 and sum(len(marked_blocks(p)) for p in RUNNABLE) >= 8


def test_every_marked_command_needs_no_vllm():
    """The suite runs them: a marked command says engine=synthetic, is --help, or is a `python -m oneknob` one."""
    bad = [f"{p.relative_to(ROOT)}:{line}: {c}" for p in RUNNABLE for line, _, commands in marked_blocks(p)
           for c in commands if not needs_no_vllm(argv_of(c))]
    assert bad == []


@pytest.mark.slow  # whole studies on the synthetic engine, the demo among them: make test runs them, test-fast not
@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_the_commands_a_page_marks_run_as_shown(page, tmp_path):
    seed_store(tmp_path)
    for line, code, commands in marked_blocks(page):
        for command in commands:
            done = run_python(argv_of(command), tmp_path, timeout=600)
            out = done.stdout + done.stderr
            assert done.returncode == code, f"{page.relative_to(ROOT)}:{line}: {command}\n{out[-4000:]}"
            assert "Traceback" not in out, out[-4000:]


# --- module and source paths named in the documentation and the config ---

# `oneknob.<name>` is also how oneknob names its MLflow tags (`oneknob.transitions`): the names its code writes
# as string constants are tags, not modules.
DOTTED = re.compile(r"(?<![\w/.-])oneknob(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.-])((?:src|tests|scripts|benchmarks|conf|experiments|patches|docs)/[\w./*-]+)")


def _tag_names() -> set[str]:
    names = set()
    for path in (ROOT / "src").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                names |= {m.split(".")[1] for m in re.findall(r"^oneknob\.\w+", node.value)}
    # a constant naming a module (`-m oneknob.run.worker`) is no tag: module paths under it are still checked
    package = ROOT / "src" / "oneknob"
    return {n for n in names if not (package / n).is_dir() and not (package / f"{n}.py").is_file()}


def _resolves(dotted: str) -> bool:
    """A module, or a module and one of its top-level names (`oneknob.engines.vllm.plugin.register`), or a
    class's member (`oneknob.run.executor.Worker.prepare`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:cut]))
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if len(rest) > 2 or not spec.origin or not spec.origin.endswith(".py"):
            return False
        tree = ast.parse(Path(spec.origin).read_text())
        if len(rest) == 2:
            return any(isinstance(n, ast.ClassDef) and n.name == rest[0] and rest[1] in {
                getattr(m, "name", None) for m in n.body} for n in tree.body)
        return rest[0] in {getattr(n, "name", None) for n in tree.body} | {
            t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return False


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of what a file says to its reader: every line of a page or a config; of Python source,
    its comments and docstrings only (its string constants are file names, tags, URLs); of pyproject.toml, its
    module names only (entry points, import contracts, comments), as its paths are mutmut's lists."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    import io
    import tokenize

    tree = ast.parse(text)
    docstrings = {node.body[0].value.lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    said = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and token.start[0] in docstrings):
            said += [(token.start[0] + i, line) for i, line in enumerate(token.string.splitlines())]
    return said


def stale_references(files: list[Path], root: Path, tags: set[str]) -> list[str]:
    found = []
    for path in files:
        for n, line in _prose(path):
            for dotted in DOTTED.findall(line):
                dotted = dotted.rstrip(".")
                if dotted.split(".")[1] not in tags and "__mutmut_" not in dotted and not _resolves(dotted):
                    found.append(f"{path.relative_to(root)}:{n}: {dotted}")
            for named in PATH.findall(line) if path.name != "pyproject.toml" else []:
                named = named.rstrip(".,:)")
                if "<" in named or named.startswith("conf/local"):
                    continue
                if not (list(root.glob(named)) if "*" in named else (root / named).exists()):
                    found.append(f"{path.relative_to(root)}:{n}: {named}")
    return found


def _documented() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "Makefile", ROOT / "patches" / "README.md",
             ROOT / "pyproject.toml", ROOT / "run.py"]
    files += sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    files += [p for p in DOCS.rglob("*.md") if not p.is_symlink()]
    files += [p for p in (ROOT / "conf").rglob("*.yaml")] + [p for p in (ROOT / "experiments").rglob("*")
                                                              if p.is_file()]
    return files


def test_every_module_and_path_the_docs_and_conf_name_exists():
    assert stale_references(_documented(), ROOT, _tag_names()) == []


def test_the_reference_check_finds_a_moved_module(tmp_path):
    (tmp_path / "conf.yaml").write_text("# typed by src/oneknob/config.py; built by oneknob.builds\n"
                                        "# the tag oneknob.transitions, oneknob.provision.builds.ensure, "
                                        "src/oneknob/config/knobs.py\n")
    (tmp_path / "src" / "oneknob" / "config").mkdir(parents=True)
    (tmp_path / "src" / "oneknob" / "config" / "knobs.py").write_text("")
    (tmp_path / "tool.py").write_text('"""Run by oneknob.engines.vllm_gone (src/oneknob/vllm_plugin.py)."""\n'
                                      'LOG = "oneknob.log"  # written beside src/oneknob/config/knobs.py\n'
                                      'def f():\n    """Like oneknob.executor."""\n')
    assert stale_references([tmp_path / "conf.yaml", tmp_path / "tool.py"], tmp_path, _tag_names()) == [
        "conf.yaml:1: oneknob.builds", "conf.yaml:1: src/oneknob/config.py",
        "tool.py:1: oneknob.engines.vllm_gone", "tool.py:1: src/oneknob/vllm_plugin.py",
        "tool.py:4: oneknob.executor"]


def test_the_changelog_names_the_version_pyproject_has():
    """Keep a Changelog: the newest version's heading is pyproject's version (and oneknob.__version__)."""
    import tomllib

    import oneknob

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == version == oneknob.__version__
    for section in re.split(r"^## ", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)[1:]:
        assert set(re.findall(r"^### (\w+)$", section, re.M)) <= {"Added", "Changed", "Deprecated", "Removed",
                                                                  "Fixed", "Security"}, section[:200]
