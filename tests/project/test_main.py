"""`python -m oneknob COMMAND`: one command with subcommands; the old module spellings are gone everywhere a user
reads or pastes a command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from oneknob import __main__ as front

ROOT = Path(__file__).resolve().parents[2]
# The spellings CHANGELOG.md lists as removed: `python -m oneknob.report` and its like.
REMOVED = re.compile(r"-m oneknob\.(report|compare|sync|engines\.vllm_contract|provision\.tiny_model|"
                     r"provision\.clean_builds)\b")


def test_help_lists_every_command(capsys):
    assert front.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("report", "compare", "sync", "vllm-contract", "tiny-model", "clean-builds"):
        assert re.search(rf"^\s+{name}\s+\S", out, re.M), out
    assert "python run.py" in out  # where a study is started


def test_no_command_prints_the_help_and_exits_2(capsys):
    assert front.main([]) == 2
    assert "report" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(front.COMMANDS))
def test_each_command_answers_help_under_its_own_name(name, capsys):
    """Every subcommand is its module's main(argv); its --help names it as the user types it."""
    with pytest.raises(SystemExit) as done:
        front.main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m oneknob {name} ")


def test_a_typo_is_refused_naming_the_closest_command(capsys):
    assert front.main(["raport", "--sweep", "x"]) == 2
    err = capsys.readouterr().err
    assert "'raport' is not a command" in err and "python -m oneknob report" in err


def test_the_package_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "oneknob", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "vllm-contract" in done.stdout, done.stderr
    gone = subprocess.run([sys.executable, "-m", "oneknob.report"], capture_output=True, text=True, timeout=60)
    assert gone.returncode != 0 and "No module named oneknob.report" in gone.stderr


def test_the_top_level_shims_are_gone():
    assert not [p for p in ("report.py", "compare.py", "sync.py") if (ROOT / "src" / "oneknob" / p).exists()]


def _texts() -> list[Path]:
    """Where a user reads a command: the sources (what oneknob prints), conf/, experiments/, docs/, the
    Makefile, the scripts, the README. Not CHANGELOG.md, which lists the removed spellings, nor the dated
    measurements of benchmarks/history/."""
    found = [ROOT / "Makefile", ROOT / "README.md", ROOT / "run.py"]
    for folder, pattern in (("src", "*.py"), ("conf", "*.yaml"), ("experiments", "*"), ("docs", "*.md"),
                            ("scripts", "*"), ("benchmarks", "*.py"), ("tests", "*.py")):
        found += [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]
    return [p for p in found if p != Path(__file__).resolve() and not p.is_symlink() and "history" not in p.parts]


def removed_spellings(paths: list[Path], root: Path = ROOT) -> list[str]:
    return [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in paths
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if REMOVED.search(line)]


def test_no_command_shown_anywhere_uses_a_removed_spelling():
    assert removed_spellings(_texts()) == []


def test_the_spelling_check_finds_one(tmp_path):
    (tmp_path / "x.py").write_text('print("upload later with: python -m oneknob.sync")\n')
    (tmp_path / "y.py").write_text('print("python -m oneknob sync; python -m oneknob.record.sync")\n')
    assert removed_spellings([tmp_path / "x.py", tmp_path / "y.py"], tmp_path) == [
        'x.py:1: print("upload later with: python -m oneknob.sync")']
