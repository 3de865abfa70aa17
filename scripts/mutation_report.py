"""Write docs/MUTATION.md from mutmut's results in mutants/ (run by `make mutate` after `mutmut run`).

    python scripts/mutation_report.py --seconds 1834 --command "make mutate"

It reads mutmut's own record of each mutant (mutants/src/oneknob/<module>.py.meta: the exit code of the
tests that ran against it) and lists every survivor with its one-line change and the reason it may stay
(JUSTIFIED below: equivalent mutants, dead code, log text). A survivor without a reason is marked
UNJUSTIFIED: kill it with a test, or say here why it cannot be killed. Mutant numbers follow the source,
so a reason whose mutant is gone is reported as stale.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants" / "src" / "oneknob"
OUT = ROOT / "docs" / "MUTATION.md"
BREAKS = "## Behaviours checked by breaking them"  # that section is scripts/break_behaviours.py's: kept as it is

# mutmut's exit codes (mutmut/stats.py): a failing test run kills the mutant; a timeout counts as killed
# (the tests did not pass), listed apart.
KILLED, TIMEOUT = {1, 3}, {36, -24, 24, 152, 255}
SURVIVED, NO_TESTS = {0}, {5, 33}

# mutant -> why it survives, one line. Keys are mutmut's names (`mutmut show NAME` prints the change).
JUSTIFIED: dict[str, str] = {
    'oneknob.plan.single_variable.x_force_add_families__mutmut_22': 'equivalent: the branch runs only when the argument, spaces dropped and lowercased, is bisect=true|false, so it holds one "=" and any maxsplit reads the same',
    'oneknob.plan.single_variable.x_force_add_families__mutmut_23': 'equivalent: as _22 (rsplit at the one "=")',
    'oneknob.plan.single_variable.x_force_add_families__mutmut_25': 'equivalent: as _22 (maxsplit 2 on one "=")',
    'oneknob.verdict.search.x_wanted__mutmut_9': 'equivalent: with no budget, left is larger than any list it cuts (the unprobed grid lengths, or one midpoint per change among the verdicts) unless about a billion lengths were measured',
    'oneknob.verdict.search.x_wanted__mutmut_12': 'equivalent: when left == 0 both later returns cut their list to [:0], which is [] as well',
    'oneknob.config.resolution.x_predict__mutmut_103': 'equivalent: with K=0 the rounding is to multiples of 1, which keeps every size',
    'oneknob.verdict.search.xǁSearchResultǁdescribe__mutmut_16': 'equivalent: span is read only when something was measured, where it is never the empty text',
    'oneknob.verdict.search.x_suspects__mutmut_18': 'equivalent: length == lo is min(grid), already in the grid, so `not in grid` drops it under >= and > alike',
    'oneknob.explain.analysis.x__notes__mutmut_10': 'equivalent: neither "" nor "XXXX" starts with "cudagraph."',
    'oneknob.explain.versus.x__relation__mutmut_17': 'equivalent: this branch runs only when was != now, where now >= was is now > was',
    'oneknob.explain.versus.x__relation__mutmut_22': 'equivalent: as _17 (was != now: now <= was is now < was)',
    'oneknob.explain.versus.x_versus_baseline__mutmut_21': 'equivalent: _relation takes `common` but never reads it',
    'oneknob.explain.claims.x__rank__mutmut_6': 'equivalent: the second element only breaks ties, and two engine candidates never share an index',
    'oneknob.explain.claims.x_tracks__mutmut_159': "equivalent: as _134 (never_moved: every run's transitions read the same)",
    'oneknob.explain.claims.x_tracks__mutmut_188': "equivalent: as _134 (never_moved: every run's transitions read the same)",
    'oneknob.plan.single_variable.x_check_release_text__mutmut_22': 'equivalent: a value Hydra reads as a float holds no "=", so the line has one and any maxsplit reads the same',
    'oneknob.plan.single_variable.x_check_release_text__mutmut_23': 'equivalent: as _22 (rsplit at the one "=")',
    'oneknob.plan.single_variable.x_check_release_text__mutmut_25': 'equivalent: as _22 (maxsplit 2 on one "=")',
    'oneknob.plan.single_variable.x_diff__mutmut_4': 'equivalent: the "vllm" key left in the view has no dot and is no RESOLVED_FIELDS entry, so diff never reads it',
    'oneknob.plan.single_variable.x_diff__mutmut_5': 'equivalent: as _4',
    'oneknob.config.knobs.x_named_kwargs__mutmut_10': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (all probes 1: enforce_eager/runner still set theirs)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_11': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (2 for 1)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_13': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (enforce_eager probed with "v1": bool, still set)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_14': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (runner probed with True: not null, its variable still set)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_15': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (enforce_eager=False is still set)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_16': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (bool knob probed with "v1", others with True)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_17': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (runner: any non-null value sets its variable)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_18': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (as _17)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_19': "equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (spec_method only names the method's value, not its key)",
    'oneknob.config.knobs.x_named_kwargs__mutmut_20': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (as _19)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_21': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (as _19)',
    'oneknob.config.knobs.x_named_kwargs__mutmut_22': 'equivalent: named_kwargs reads only which keys the probe sets, and every named knob sets the same keys for any non-null probe value (as _19)',
    'oneknob.config.knobs.x_family_knob__mutmut_3': 'equivalent: family_knob is only reached for is_family keys, whose name is an identifier (one dot), where rpartition == partition',
    'oneknob.config.knobs.x_is_family__mutmut_3': 'equivalent: with two or more dots partition leaves a dot in the name (no identifier) and rpartition one in the group (no family): False either way',
    'oneknob.config.knobs.x_knob__mutmut_8': 'equivalent: only is_family keys get here, with one dot: rpartition == partition',
    "oneknob.explain.analysis.x_shape_text__mutmut_38": "equivalent: search.polluted_spans reads only \"polluted\"; any "
                                                "other word is clean",
    "oneknob.explain.analysis.x_shape_text__mutmut_39": "equivalent: as _38",
    "oneknob.explain.claims.x_tracks__mutmut_134": "equivalent: the never_moved branch runs only when every run's "
                                           "transitions read the same, so exact[1] reads as exact[0]",
    "oneknob.explain.claims.x_tracks__mutmut_38": "equivalent: every return path sets result[\"text\"]; its first value "
                                          "is never read",
    "oneknob.explain.confounds.x__trial_values__mutmut_67": "equivalent: > and >= differ only at 256, whose 3/4 (192) is "
                                                    "a multiple of 16 and of 8",
    "oneknob.explain.confounds.x_suggest__mutmut_16": "equivalent: sorting whole trials sorts by their score first, and "
                                              "no two trials share a score (rank and order are unique)",
    "oneknob.explain.confounds.x_suggest__mutmut_18": "equivalent: as _16",
    "oneknob.config.resolution.x_round_for_v1_spec_decode__mutmut_17": "equivalent (dead code): when K+1 <= the largest "
                                                                 "size, the smallest size rounds up to a size <= "
                                                                 "it, so `rounded` is never empty there",
    "oneknob.config.resolution.x_round_for_v1_spec_decode__mutmut_18": "equivalent (dead code): as _17",
    "oneknob.config.resolution.x__uniform_decode_sizes__mutmut_18": "equivalent: a decode size equals the maximum only at "
                                                             "the device's ceiling (512, 1024), a grid size "
                                                             "already",
    "oneknob.config.resolution.x__uniform_decode_sizes__mutmut_5": "equivalent: max_num_seqs equals the maximum only at "
                                                            "the ceiling, a grid size already",
    "oneknob.config.resolution.x_capture_sizes__mutmut_35": "equivalent: a decode size equal to the token budget is "
                                                     "captured anyway (the budget itself is, when it fits)",
    "oneknob.config.resolution.x_predict__mutmut_96": "equivalent: with K=0 the V1 rounding is to multiples of 1",
    "oneknob.verdict.search.x_wanted__mutmut_11": "equivalent: with nothing left, missing[:0] and the midpoints[:0] are "
                                          "empty too",
    "oneknob.verdict.search.x_wanted__mutmut_6": "equivalent: without a budget any bound >= the grid's length asks for "
                                         "everything (open transitions are fewer than grid intervals)",
    "oneknob.verdict.search.x_wanted__mutmut_7": "equivalent: as _6",
    "oneknob.verdict.search.x_wanted__mutmut_8": "equivalent: as _6",
    "oneknob.plan.single_variable.x_closest_knob__mutmut_8": "equivalent: only the best match is read; more matches come "
                                                        "after it",
    "oneknob.plan.single_variable.x_closest_knob__mutmut_9": "equivalent: 0.6 is difflib's default cutoff",
    "oneknob.plan.single_variable.x_closest_knob__mutmut_11": "equivalent: as _8",
    "oneknob.verdict.judge.x_judge__mutmut_32": "equivalent: topk_compare zips the engine's length - 1 rows with the "
                                          "reference's, so a longer slice adds nothing",
    'oneknob.explain.hypotheses.x_hypotheses__mutmut_69': 'equivalent: a value equal to the side is left out by `h.value != side` beside it, so < and <= pick the same values',
    'oneknob.explain.hypotheses.x_hypotheses__mutmut_70': 'equivalent: the loop runs below=True and below=False both, so swapping them only reorders `chosen`, which is sorted afterwards by (relative distance, rank), unique per candidate',
    'oneknob.explain.hypotheses.x__edges__mutmut_3': 'equivalent: oracle names are strings, so with no oracle run["oracles"].get(None) is no record and the combined transitions are read either way',
    'oneknob.explain.hypotheses.x_conclude__mutmut_10': 'equivalent: "stayed" sorts last under 2 and 3 alike',
    'oneknob.explain.hypotheses.x__power_of_two__mutmut_4': 'equivalent: `chosen` is the candidate `tracks` names, so it is None exactly when tracks is',
    'oneknob.explain.hypotheses.x__power_of_two__mutmut_8': 'equivalent: tracks is set only from a moved word in words[tracks], so the key is always there',
    'oneknob.explain.hypotheses.x__power_of_two__mutmut_10': 'equivalent: as _8',
    'oneknob.explain.tested.x__offset_text__mutmut_17': 'equivalent: the sign is written only where at_position != value, where >= is >',
    'oneknob.explain.tested.x_annotate__mutmut_111': 'equivalent: label(None) is None (CANDIDATES.get(None, None))',
    'oneknob.explain.followup_design.x_trial_values__mutmut_27': "equivalent (dead default): every value tried is >= 1 and vLLM's capture grid starts at 1, so a grid size <= it always exists",
    'oneknob.explain.followup_design.x_trial_values__mutmut_29': 'equivalent: as _27',
    'oneknob.explain.followup_design.x_design__mutmut_14': 'equivalent: movers takes the run but never reads it',
    'oneknob.explain.followup_design.x_design__mutmut_91': 'equivalent: no two trials share a score (rank and order are unique), so comparing whole (score, Design) pairs is decided by the score',
    'oneknob.explain.followup_design.x_design__mutmut_93': 'equivalent: as _91',
    'oneknob.explain.followup_design.x_decisive__mutmut_16': "equivalent: `same` needs both verdicts equal, so pair[0]'s is None exactly when pair[1]'s is",
    'oneknob.explain.run_edges.x_same_edges__mutmut_57': 'equivalent: ordered() reads only the keys of the mapping it is given, never its values',
    'oneknob.explain.run_edges.x_same_edges__mutmut_59': 'equivalent: as _57',
    'oneknob.explain.run_edges.x_same_edges__mutmut_60': 'equivalent: as _57',
    'oneknob.explain.run_edges.x_same_edges__mutmut_69': 'equivalent: as _57',
    'oneknob.explain.run_edges.x_same_edges__mutmut_71': 'equivalent: as _57',
    'oneknob.explain.run_edges.x_same_edges__mutmut_72': 'equivalent: as _57',
}


def load() -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):  # one per module, under its package
        codes |= json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def change_of(name: str) -> str:
    """The mutated line, before -> after, from mutmut's own diff."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
        # oneknob.<package>.<module>.x_...: its file named, mutmut need not search every module's results
        diff = get_diff_for_mutant(name, path=Path("src", *name.split(".")[:2], name.split(".")[2] + ".py"))
    except Exception as exc:  # an old mutants/ tree: say so rather than fail the report
        return f"(no diff: {type(exc).__name__})"
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return f"`{' '.join(removed)}` -> `{' '.join(added)}`"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, help="how long `mutmut run` took")
    parser.add_argument("--command", default="make mutate")
    args = parser.parse_args()
    import os

    os.chdir(ROOT)  # mutmut's helpers read mutants/ relative to the working directory
    codes = load()
    if not codes:
        print(f"no mutmut results under {MUTANTS}: run `make mutate`", file=sys.stderr)
        return 1
    status = {name: ("killed" if code in KILLED else "timeout" if code in TIMEOUT else "survived"
                     if code in SURVIVED else "no tests" if code in NO_TESTS else "not checked"
                     if code is None else f"exit {code}") for name, code in codes.items()}
    total = len(status)
    counts = Counter(status.values())
    killed = counts["killed"] + counts["timeout"]
    module_of = {name: name.split(".")[2] for name in status}  # oneknob.<package>.<module>.x_...
    per_module = {m: Counter(s for n, s in status.items() if module_of[n] == m)
                  for m in sorted(set(module_of.values()))}
    survivors = sorted(n for n, s in status.items() if s not in ("killed", "timeout", "not checked"))
    checked = total - counts["not checked"]  # a run cut short (or MUTANTS=) leaves mutants without a result
    unjustified = [n for n in survivors if n not in JUSTIFIED]
    stale = sorted(set(JUSTIFIED) - set(survivors) - {n for n, st in status.items() if st == "not checked"})
    minutes = f"{args.seconds / 60:.0f} min ({args.seconds} s)" if args.seconds else "not measured"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    import mutmut

    lines = [
        "# Mutation testing of the core",
        "",
        "Written by `scripts/mutation_report.py` from mutmut's results; rerun `make mutate` when the core changes.",
        "Not part of `make test` (too slow for CI).",
        "",
        f"killed: {killed} of {checked} checked ({100 * killed / max(checked, 1):.1f} %)"
        + (f"; {counts['not checked']} of {total} not checked" if counts["not checked"] else ""),
        "",
        f"- command: `{args.command}`" + (" (`rm -rf mutants && mutmut run --max-children N`, then this script)"
                                           if args.command.startswith("make mutate") and "MUTANTS=" not in args.command
                                           else ""),
        f"- time: {minutes} for `mutmut run` on {os.cpu_count()} CPU cores, "
        f"{datetime.date.today().isoformat()}; mutmut {mutmut.__version__}, Python {platform.python_version()}",
        f"- mutated: {', '.join(Path(p).name for p in config['only_mutate'])} (`[tool.mutmut]` in pyproject.toml)",
        f"- tests: {', '.join(Path(p).stem for p in config['pytest_add_cli_args_test_selection'])}, in process "
        "(`-m \"not slow\"`), without the report.md ones (`-k \"not report_md\"`: they render plots); mutmut runs, "
        "per mutant, the tests that call the mutated function",
        f"- of which by timeout: {counts['timeout']}; survived: {counts['survived']}; no test calls the function: "
        f"{counts['no tests']}" + (f"; not checked: {counts['not checked']}" if counts["not checked"] else ""),
        "",
        "| module | mutants | killed | of which by timeout | survived | no tests | not checked | killed % of checked |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for module, found in per_module.items():
        mutants, dead = sum(found.values()), found["killed"] + found["timeout"]
        lines.append(f"| {module}.py | {mutants} | {dead} | {found['timeout']} | {found['survived']} | "
                     f"{found['no tests']} | {found['not checked']} | "
                     f"{100 * dead / max(mutants - found['not checked'], 1):.1f} |")
    lines += ["", f"## Surviving mutants ({len(survivors)})", "",
              "Each is equivalent to the original (no test can tell them apart) or changes only text no behaviour "
              "reads; `mutmut show NAME` prints the change in full.", ""]
    for name in survivors:
        reason = JUSTIFIED.get(name, "UNJUSTIFIED: kill it with a test, or say why it cannot be killed")
        lines.append(f"- `{name}` ({status[name]}): {change_of(name)}: {reason}")
    timeouts = sorted(n for n, st in status.items() if st == "timeout")
    if timeouts:
        lines += ["", f"## Killed by timeout ({len(timeouts)})", "",
                  "The tests never finished (mutmut's CPU-time limit): a search that no longer converges.", ""]
        lines += [f"- `{name}`: {change_of(name)}" for name in timeouts]
    if stale:
        lines += ["", "Reasons for mutants that no longer survive (or no longer exist): " + ", ".join(stale)]
    kept = OUT.read_text().partition(BREAKS) if OUT.exists() else ("", "", "")
    OUT.write_text("\n".join(lines) + "\n" + (f"\n{BREAKS}{kept[2]}" if kept[1] else ""))
    print(f"{OUT}: killed {killed} of {checked} checked ({100 * killed / max(checked, 1):.1f} %); "
          f"{len(unjustified)} unjustified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
