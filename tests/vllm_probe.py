"""Drive oneknob.engines.vllm.VllmEngine for one configuration, in its own process.

vLLM starts its engine core with spawn, so this must run as a script (the
`__main__` guard), never be imported by pytest's process:

    python tests/vllm_probe.py REQUEST.json RESULT.json

REQUEST: {"spec": <WorkerSpec dict>, "prompts": [[token ids], ...]}
RESULT:  {"resolved": {...}, "provenance": {...}, "start_s": float,
          "results": [{"n": len(ids), "logprobs": [...], "seconds": float}, ...]}

The knobs' environment is applied before vLLM is imported, as oneknob.worker does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def probe(request: dict) -> dict:
    from oneknob.knobs import engine_args

    spec = request["spec"]
    os.environ.update(engine_args(spec["knobs"], spec.get("settings") or {}).env)
    from oneknob.engines.vllm import VllmEngine

    engine = VllmEngine()
    t0 = time.monotonic()
    engine.start(spec)
    start_s = time.monotonic() - t0
    try:
        resolved, provenance = engine.resolved_config(), engine.provenance()
        results = []
        for ids in request["prompts"]:
            t = time.monotonic()
            logprobs = engine.prompt_logprobs(ids)
            results.append({"n": len(ids), "logprobs": logprobs, "seconds": time.monotonic() - t})
    finally:
        engine.close()
    return {"resolved": resolved, "provenance": provenance, "start_s": start_s, "results": results}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    result = probe(json.loads(Path(request_path).read_text()))
    Path(result_path).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
