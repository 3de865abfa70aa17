"""The loop a user writes instead of oneknob: build an LLM, loop over lengths, read prompt logprobs, print NLL.

    python -m benchmarks.hand_loop [--engine vllm|synthetic] [--lengths 128,256] [--samples 2]

The engine arguments are the seed's baseline (experiment=mtp_prompt_logprobs), written by hand; the
prompts are the first L tokens of consecutive 2048-token slices of the Python standard library's
sources (what oneknob's default corpus is), so both measure the same requests. The last line is a
JSON record of timings for benchmarks.overhead (everything above it is what the user sees).
"""

import argparse
import glob
import json
import math
import os
import sysconfig
import time

LENGTHS = "128,200,256,257,300,480,512,513,600,768,1024"
MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny-mtp")


def prompts(encode, samples, sample_tokens=2048):
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    text = "\n".join(open(f, encoding="utf-8", errors="replace").read() for f in files[:40])
    ids = encode(text)
    return [ids[i * sample_tokens:(i + 1) * sample_tokens] for i in range(samples)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="vllm", choices=["vllm", "synthetic"])
    ap.add_argument("--lengths", default=LENGTHS)
    ap.add_argument("--samples", type=int, default=2)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    t0 = time.perf_counter()
    if args.engine == "vllm":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # the seed's runner; vLLM reads it at import
        from tokenizers import Tokenizer
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
        samples = prompts(lambda text: tok.encode(text, add_special_tokens=False).ids, args.samples)
        llm = LLM(model=MODEL, dtype="float32", max_model_len=2048, seed=0, gpu_memory_utilization=0.2,
                  max_num_batched_tokens=2048, enforce_eager=False, max_num_seqs=128,
                  speculative_config={"method": "mtp", "num_speculative_tokens": 3})
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)

        def logprobs(ids):
            (out,) = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)
            return [out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0]
    else:  # oneknob's simulation of vLLM, driven directly, in this process
        from oneknob.engines.synthetic import SyntheticEngine

        samples = prompts(lambda text: list(text.encode()), args.samples)
        engine = SyntheticEngine()
        engine.start({"knobs": {"cudagraph.capture": None, "cudagraph.enforce_eager": False,
                                "sched.max_num_seqs": 128, "spec.k": 3, "runner": "v1"},
                      "options": {"max_num_batched_tokens": 2048}, "seed": 0})
        def logprobs(ids):
            return engine.score(ids)["logprobs"]
    t_ready = time.perf_counter()
    after_length, nll = [], {}
    for length in lengths:
        nlls = [-math.fsum(logprobs(s[:length])) / (length - 1) for s in samples]
        nll[length] = sum(nlls) / len(nlls)
        print(f"L={length:5d}  NLL={nll[length]:.4f}", flush=True)
        after_length.append(time.perf_counter() - t_ready)
    print(json.dumps({"start_s": t_ready - t0, "measure_s": after_length[-1], "after_length_s": after_length,
                      "nll": nll}), flush=True)
    if args.engine == "vllm":  # as oneknob's worker ends: shut the engine down, skip interpreter teardown
        llm.llm_engine.engine_core.shutdown()  # (which aborted once in 7 runs here: "terminate called ...")
        os._exit(0)


if __name__ == "__main__":
    main()
