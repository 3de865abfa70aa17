"""`python -m oneknob COMMAND`: oneknob's commands beside the study itself (`python run.py`, a Hydra app).

    python -m oneknob --help                # the commands
    python -m oneknob report --help         # one command's options

Each command is the `main(argv)` of the module that owns it, imported only when it runs, so `--help` costs no
MLflow or vLLM import. The worker, the uploader and the checks that run inside vLLM's interpreter are started by
oneknob itself (`python -m oneknob.run.worker`, ...) and are not commands.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

# name -> (the module whose main(argv) runs it, what it does). `make <name>` runs most of them.
COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("oneknob.explain.report_command",
               "print a sweep's report.md, rebuilt from MLflow (paste it into an issue); writes nothing"),
    "compare": ("oneknob.explain.compare",
                "rebuild a sweep's comparison from MLflow: summary.json, report.md, plots, the parent run's page"),
    "sync": ("oneknob.record.sync", "upload to MLflow what the jobs' journals hold and MLflow lacks (any number "
                                    "of times)"),
    "vllm-contract": ("oneknob.engines.vllm.contract",
                      "check every vLLM name oneknob uses against a vLLM release's sources, nothing imported"),
    "tiny-model": ("oneknob.provision.tiny_model", "build the tiny MTP checkpoint the CPU studies run on"),
    "clean-builds": ("oneknob.provision.clean_builds",
                     "remove the vLLM builds oneknob made (environments, patched copies) unused for DAYS"),
}

STUDY = """\
a study (one job, or a sweep with -m) is `python run.py`, not a command here:
  python run.py --help                               the knobs and the common keys
  python run.py -m experiment=mtp_prompt_logprobs    the seed's study (make ablate; make demo: simulated)"""


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m oneknob", description="oneknob's commands beside the study itself.", epilog=STUDY,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=22, width=110))
    commands = found.add_subparsers(title="commands", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        parser().print_help(file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"did you mean `python -m oneknob {close[0]}`? " if close else ""
        print(f"python -m oneknob: {name!r} is not a command; {hint}the commands: {', '.join(COMMANDS)} "
              "(python -m oneknob --help says what each does)", file=sys.stderr)
        return 2
    module, _ = COMMANDS[name]
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    sys.exit(main())
