"""What each oracle costs per prompt, against `nll` alone, on one engine.

One worker (oneknob.run.executor, as jobs use it) per engine, started once; per prompt length the four request
kinds are interleaved turn by turn (so both sides of each ratio see the same machine load): `nll` (prompt
logprobs only), `+topk` (prompt_logprobs=5: the same request returns the top 5 per position), `+greedy` (a
16-token greedy continuation after the prompt) and all three. The median seconds per request (the worker's
own timing, engine time only) and the ratio to `nll` are reported. The reference's greedy continuations
cost one more such request per probed length, once per study (they are stored and reused).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import tmpdir

KINDS = {"nll": (0, 0), "+topk": (5, 0), "+greedy": (0, 16), "nll+topk+greedy": (5, 16)}


def _spec(engine: str, model: str) -> dict:
    knobs = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128, "spec.k": 3,
             "runner": "v1", "vllm.version": None, "vllm.patch": None}
    options = {"gpu_memory_utilization": 0.2, "max_num_batched_tokens": 2048, "extra": {}} if engine == "vllm" \
        else {"max_num_batched_tokens": 2048}
    return {"engine": engine, "knobs": knobs, "settings": {"spec_method": "mtp"}, "seed": 0, "options": options,
            "model": {"path": model, "dtype": "float32", "max_model_len": 2048, "tokenizer": None,
                      "tensor_parallel_size": 1}}


def bench(engine: str, lengths=(128, 512, 1024), turns: int = 5, log=print) -> dict:
    from oneknob.provision import tiny_model
    from oneknob.config.schema import REPO_ROOT
    from oneknob.provision.corpus import BYTES, file_tokenizer, load_corpus
    from oneknob.run.executor import Worker

    model = str(tiny_model.ensure(REPO_ROOT / "models" / "tiny-mtp")) if engine == "vllm" else "synthetic"
    tokenizer = file_tokenizer(model) if engine == "vllm" else BYTES
    corpus = load_corpus(None, tokenizer, 2048, 1)
    work = tmpdir(f"oracles-{engine}")
    seconds: dict[tuple[str, int], list[float]] = {}
    with Worker(_spec(engine, model), Path(work) / "worker.log", start_timeout_s=900, request_timeout_s=300) as worker:
        ready = worker.start()
        log(f"oracles/{engine}: engine ready in {ready.start_s:.1f} s ({work})")
        for length in lengths:
            prompt = corpus.prompt(length, 0)
            worker.score(prompt, topk=5, greedy=16)  # warm-up: the first request of a length is slower
            for _ in range(turns):
                for kind, (topk, greedy) in KINDS.items():
                    seconds.setdefault((kind, length), []).append(worker.score(prompt, topk=topk,
                                                                               greedy=greedy)["seconds"])
    medians = {key: statistics.median(values) for key, values in seconds.items()}
    return {"engine": engine, "lengths": list(lengths), "turns": turns, "medians": medians}


def markdown(results: list[dict]) -> str:
    lines = ["| engine | prompt tokens | " + " | ".join(f"{k} s (x nll)" for k in KINDS) + " |",
             "|---|---|" + "---|" * len(KINDS)]
    for result in results:
        for length in result["lengths"]:
            base = result["medians"][("nll", length)]
            cells = [f"{result['medians'][(k, length)]:.4f} ({result['medians'][(k, length)] / base:.2f}x)"
                     for k in KINDS]
            lines.append(f"| {result['engine']} | {length} | " + " | ".join(cells) + " |")
    lines.append(f"\nMedians of {results[0]['turns']} interleaved turns per cell, after one warm-up request.")
    return "\n".join(lines)
