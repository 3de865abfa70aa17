"""The task behind run.py, and the dry-run plan shared with the sweepers."""

from __future__ import annotations

import json
import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf
from rich.table import Table

from oneknob import guard, knobs, provenance, resolution
from oneknob.corpus import CorpusError
from oneknob.job import console, run_job
from oneknob.plan import ConfigError
from oneknob.tracking import TrackingError

# What is refused before any engine starts, with a message that names key, value and fix.
REFUSALS = (guard.GuardError, knobs.KnobError, ConfigError, CorpusError, TrackingError)


def predicted_resolved(cfg, values: dict[str, Any]) -> dict[str, Any]:
    """What the engine is expected to resolve these knobs to (vLLM 0.33's rules)."""
    on_gpu = cfg.engine.name == "vllm" and bool(provenance.gpu())
    platform = "cuda" if cfg.engine.name == "synthetic" or on_gpu else "cpu"
    return resolution.predict(
        values, platform=platform, spec_method=cfg.spec.method,
        default_max_num_seqs=cfg.engine.default_max_num_seqs,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        default_runner=cfg.engine.default_runner)


def print_plan(cfg, jobs: list[tuple[str | None, dict[str, Any]]]) -> None:
    """The dry run: jobs, their knob values and predicted resolved values; no engine starts."""
    table = Table(title=f"plan: {len(jobs)} job(s) on engine={cfg.engine.name} (dry run: nothing is started)")
    for column in ("job", *knobs.KNOBS, "predicted capture", "mode", "K", "max_num_seqs"):
        table.add_column(column)
    for knob, values in jobs:
        predicted = predicted_resolved(cfg, values)
        name = f"{knob}={json.dumps(values[knob])}" if knob else "baseline"
        table.add_row(name, *(json.dumps(values[k]) for k in knobs.KNOBS),
                      str(predicted["max_capture_size"]), predicted["cudagraph_mode"],
                      str(predicted["spec_k"]), str(predicted["max_num_seqs"]))
    console.print(table)
    console.print(f"lengths {list(cfg.lengths)} x {cfg.samples} sample(s); reference "
                  f"{json.dumps(OmegaConf.to_container(cfg.reference) if cfg.reference is not None else None)}")


# Exit codes, for single runs and sweeps alike.
EXIT_FAILED, EXIT_REFUSED, EXIT_TRACKING_INCOMPLETE, EXIT_INTERRUPTED = 1, 2, 3, 130


def main_task(cfg) -> dict[str, Any]:
    """One job. A single run (no -m) exits with the codes above; in a sweep the sweeper decides."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.RUN:
        return run_job(cfg, hydra_cfg.runtime.output_dir)
    try:
        guard.check_single(list(hydra_cfg.overrides.task))
        if cfg.dry_run:
            print_plan(cfg, [(None, knobs.from_config(cfg))])
            return {"status": "dry_run"}
        outcome = run_job(cfg, hydra_cfg.runtime.output_dir)
    except REFUSALS as exc:
        console.print(f"[red]refused:[/] {exc}")
        console.print("nothing was started and no run was recorded")
        sys.exit(EXIT_REFUSED)
    except KeyboardInterrupt:
        console.print("[red]interrupted: finished points are kept; rerun the same command to resume[/]")
        sys.exit(EXIT_INTERRUPTED)
    if outcome.get("status") in ("failed", "killed", "refused"):
        sys.exit(EXIT_FAILED)
    if outcome.get("tracking"):
        sys.exit(EXIT_TRACKING_INCOMPLETE)
    return outcome
