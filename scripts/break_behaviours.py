"""Break each behaviour of issue 18 in a copy of the repository and run the tests that must catch it.

    .venv/bin/python scripts/break_behaviours.py        # every break (a few minutes: some are CLI tests)
    .venv/bin/python scripts/break_behaviours.py 3 5     # only these

Each break is a one-line edit of src in a temporary copy (the working tree is never touched); the copy's src
goes first on PYTHONPATH, so the tests, and the CLI they start, run the broken code. Every break must make
its tests fail; a break whose text is no longer in src is reported as not applied (update it with the src).
It writes the result as the last section of docs/MUTATION.md (scripts/mutation_report.py keeps it).
"""
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]
SECTION = "## Behaviours checked by breaking them"  # as in scripts/mutation_report.py
COPY = Path(tempfile.mkdtemp(prefix="oneknob-break-")) / "repo"

PS = "tests/study/test_fault_shapes.py::"
BEHAVIOURS = "tests/study/test_behaviours.py::"
# (behaviour, file, original text, broken text, the tests that must fail)
BREAKS = [
    ("the verdict rule > tol_nll AND > rtol_nll reduced to the absolute part", "src/oneknob/verdict.py",
     "polluted = all(fails(delta_nll, nll_ref, verdict).values())",
     "polluted = fails(delta_nll, nll_ref, verdict)['tol_nll']",
     ["tests/verdict/test_verdict.py", PS + "test_polluted_needs_both_the_absolute_and_the_relative_tolerance"]),
    ("absolute mode (reference=null, verdict.max_nll) always clean", "src/oneknob/verdict.py",
     "polluted=nll > verdict.max_nll,", "polluted=False,",
     ["tests/verdict/test_verdict.py", PS + "test_absolute_mode_judges_by_max_nll_and_measures_no_reference"]),
    ("polluted if any sample is -> if all samples are", "src/oneknob/verdict.py",
     "return POLLUTED if any(p.polluted for p in points) else CLEAN",
     "return POLLUTED if all(p.polluted for p in points) else CLEAN",
     ["tests/verdict/test_verdict.py",
      PS + "test_any_polluted_sample_pollutes_the_length_and_tolerance_edges_are_named"]),
    ("single_variable.side_effects=refuse ignored", "src/oneknob/single_variable.py",
     'if policy == "refuse":', "if False:",
     ["tests/plan/test_single_variable.py",
      BEHAVIOURS + "test_side_effects_refuse_measures_nothing_of_a_variant_that_moves_another_field"]),
    ("single_variable.run_noops=true ignored", "src/oneknob/single_variable.py",
     "if not run_noops:", "if True:",
     ["tests/plan/test_single_variable.py", BEHAVIOURS + "test_run_noops_measures_the_noop_variant"]),
    ("a real no-op is never skipped", "src/oneknob/single_variable.py",
     '            found.status = "noop"\n', "            pass\n",
     ["tests/plan/test_single_variable.py",
      BEHAVIOURS + "test_a_variant_that_changes_nothing_in_the_engine_is_skipped"]),
    ("a pin that does not restore the field is not flagged", "src/oneknob/single_variable.py",
     "    if found.side_effects:\n        found.note += f\"; pinning did not restore",
     "    if False:\n        found.note += f\"; pinning did not restore",
     ["tests/plan/test_single_variable.py",
      BEHAVIOURS + "test_a_pin_that_does_not_restore_the_field_is_flagged_and_measured"]),
    ("no knob can pin the field: not flagged (cannot pin, so flag)", "src/oneknob/single_variable.py",
     "    return _flag(found)\n\n\ndef after_pin", "    return found\n\n\ndef after_pin",
     ["tests/plan/test_single_variable.py"]),
    ("the CPU build's runner=v2 skip removed", "src/oneknob/engines/vllm/facts.py",
     'if knob_values["runner"] == "v2" and defaults["platform"] == "cpu":', "if False:",
     [BEHAVIOURS + "test_the_cpu_build_skips_runner_v2_and_says_so"]),
    ("MLFLOW_TRACKING_URI ignored", "src/oneknob/tracking.py",
     'return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite', 'return f"sqlite',
     ["tests/record/test_tracking.py", BEHAVIOURS + "test_mlflow_tracking_uri_from_the_environment_is_where_runs_go"]),
    ('"PREDICTION WRONG" never said', "src/oneknob/analysis.py",
     'held = None if run["resolved"].get("simulated") else predicted == resolved',
     'held = None if run["resolved"].get("simulated") else True',
     ["tests/explain/test_analysis.py"]),
    ("resolved-config mismatches not reported", "src/oneknob/analysis.py",
     "        return [f\"cannot predict: {exc}\"]\n    return [",
     "        return [f\"cannot predict: {exc}\"]\n    return [] and [",
     ["tests/explain/test_analysis.py"]),
]


def run(index: int, what: str, path: str, old: str, new: str, tests: list[str]) -> str:
    if COPY.exists():
        shutil.rmtree(COPY)
    shutil.copytree(SRC, COPY, ignore=shutil.ignore_patterns(".venv", "mutants", ".cache", "mlruns", "multirun",
                                                              "outputs", "models", ".git"))
    if (SRC / "models").exists():
        os.symlink(SRC / "models", COPY / "models")
    target = COPY / path
    text = target.read_text()
    if text.count(old) != 1:
        return f"NOT APPLIED ({text.count(old)} matches of the original text)"
    target.write_text(text.replace(old, new))
    done = subprocess.run([str(SRC / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=COPY, env=dict(os.environ, PYTHONPATH=str(COPY / "src")), capture_output=True,
                          text=True, timeout=1800)
    lines = done.stdout.splitlines()
    summary = [line for line in lines if " passed" in line or " failed" in line][-1:]
    failed = sorted({line.split()[1].split("[")[0] for line in lines if line.startswith("FAILED")})
    caught = done.returncode == 1 and all(any(f.startswith(t.split("::")[0]) for f in failed) for t in tests)
    return f"{'caught' if caught else 'NOT CAUGHT'} ({' '.join(summary)}): {', '.join(failed) or 'nothing failed'}"


def main() -> int:
    only = sys.argv[1:]
    results = []
    for index, (what, path, old, new, tests) in enumerate(BREAKS):
        if only and str(index) not in only:
            continue
        results.append((what, run(index, what, path, old, new, tests)))
        print(f"{index}. {what}: {results[-1][1]}", flush=True)
    shutil.rmtree(COPY.parent, ignore_errors=True)
    if not only:
        write(results)
    return 0 if all(result.startswith("caught") for _, result in results) else 1


def write(results: list[tuple[str, str]]) -> None:
    out = SRC / "docs" / "MUTATION.md"
    head = out.read_text().partition(SECTION)[0].rstrip("\n") if out.exists() else "# Mutation testing of the core"
    lines = [SECTION, "", f"`.venv/bin/python scripts/break_behaviours.py`, {datetime.date.today().isoformat()}: "
             "each behaviour of issue 18 broken by a one-line edit of src in a copy of the repository, and the tests "
             "that must catch it run against the copy.", ""]
    lines += [f"- {what}: {result}" for what, result in results]
    out.write_text(head + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
