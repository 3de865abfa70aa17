"""The synthetic engine: a documented SIMULATION of vLLM, for demos and tests.

It needs no GPU and no model. It is honest about being a stand-in:

* Resolution: knobs resolve with vLLM 0.33's rules (oneknob.config.resolution), so
  K moves the default capture size exactly as it does in vLLM.
* Language model: an adaptive, causal bigram model over byte tokens. The
  logprob of token t depends only on tokens before it, so prefixes score
  exactly as in a longer prompt; mean NLL starts near log(256) and falls with
  context to a few nats.
* Fault model (the mechanism of vLLM PR #53520, as a rule): when CUDA graphs
  are on, K > 0 and the runner is a polluting one, a prompt of L tokens (the
  step's token count: one prompt per request) is polluted where its shape
  (`engine.fault.*`) says so. The default is the seed's: L <= the resolved max
  capture size. `edge` names another quantity of the resolved config
  (config.quantities.CANDIDATES, e.g. seqs_x_query_len) or none; `side` is le | lt | gt
  (L <= edge, L < edge, L > edge); `islands` adds polluted ranges [lo, hi];
  `prompt_prefix` limits the fault to prompts starting with that text (so
  samples can disagree); `target` says what a polluted prompt corrupts: its
  prompt logprobs (`prompt`, the seed's bug: generation stays clean), its
  generated tokens (`generation`: a decode-only bug, prompt logprobs untouched), or `both`.
  `decode_from_position: P` moves generation's fault from the prompt's length to the positions a
  continuation reaches: every generated token at absolute position >= P (a prompt of L tokens is followed by
  positions L, L+1, ...) is corrupted, whatever the shape says of L (the mechanism's conditions still apply);
  `decode_shift: S` corrupts a generated token by lowering its logprob S nats and keeping the token (a decode
  drift that flips nothing), else (null) the token flips and its logprob is garbage.
* Generation (for the oracles): the same bigram model continues the prompt
  greedily, adapting to its own output, and reports each generated token's
  own logprob; top-k lists come from its whole distribution at every position.
  Polluted logprobs are garbage of 10-16 nats per token, as if read from an output buffer the padded drafter
  overwrote, or, with `shift`, the clean ones with `shift` nats added to every token's NLL.
* A reference that is length-dependent by design (`engine.fault.reference_switch: S`): the engine started in
  the reference role scores a prompt of at most S tokens with `reference_shift` nats (0.5) added to every
  token's NLL, as HF transformers' longrope picks its RoPE factors from the whole prompt's length; so the
  first 128 tokens of a 1024-token prompt score differently from a 128-token prompt, the reference's prefix
  self-check fails, and the reference must be measured per length (`reference_per_length`).
  `engine.fault.model_config` is what the simulated model's config.json declares (its length fields are
  candidates `model.<path>`, e.g. {rope_scaling: {original_max_position_embeddings: 300}}); `edge` may name one
  (`model.rope_scaling.original_max_position_embeddings`), and a `model.override.<path>` knob moves it, as a
  changed config.json would.
* Batches (one engine call of several prompts, `batch`: axis=batch and axis=repeat): the engine schedules them as
  vLLM's scheduler does, first come first served, each step at most `max_num_batched_tokens` tokens and
  `max_num_seqs` requests, a prompt longer than what is left of a step's budget chunked over several steps
  (chunked prefill), and says which tokens each step scheduled. The fault's shape is then judged on a step's
  token count, not a prompt's length: a prompt is polluted when any step that scheduled part of it has a token
  count on the fault's side of its edge (or inside an island). This is the seed's mechanism exactly: a graph runs
  when the step's tokens fit a captured size, whoever they belong to; one prompt alone is the case L = step.
* Nondeterminism (`engine.fault.nondeterministic_above: C`): in an engine call of more than C requests, every
  request's prompt logprobs carry noise of up to `nondeterminism` nats (0.5) per token, drawn afresh on every
  call and for every request, as a batch-variant kernel would; C requests or fewer are bit-identical from call
  to call. axis=repeat finds the C|C+1 transition.
* Injected failures for tests of the orchestrator: crash or hang at a given
  length, crash during start, a delay per request; engine warnings (`engine.fault.warnings`: logged at start
  as vLLM logs its own, `{field}` filled from the resolved config, so runs can differ in them).

Its resolved config is the resolution rules' prediction itself (marked
`simulated`), so a comparison of "predicted vs resolved" cannot fail here.
`SyntheticFacts` is what the planner knows of it: byte tokens, no model, the
defaults set under `engine.*` in conf/engine/synthetic.yaml.
"""

from __future__ import annotations

import collections
import math
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from oneknob.config import resolution
from oneknob.config.quantities import CANDIDATES, POWER_OF_TWO, derived_quantities, model_quantities
from oneknob.config import knobs, model_override
from oneknob.errors import ConfigError, UnavailableHere

VOCAB = 256  # byte tokens
SIDES = {"le": "L <= edge", "lt": "L < edge", "gt": "L > edge"}
TARGETS = ("prompt", "generation", "both")
EDGES = [c for c in CANDIDATES if c != POWER_OF_TWO]


def bigram_tables(token_ids: list[int], continue_for: int = 0) -> tuple[np.ndarray, list[int], list[float]]:
    """The same model's whole log-distribution at every position (row i predicts token i + 1), and a greedy
    continuation of `continue_for` tokens with each one's logprob, the model adapting to its own output."""
    ids = list(map(int, token_ids))
    bigram = np.zeros((VOCAB, VOCAB))
    unigram = np.ones(VOCAB)
    rows = np.empty((len(ids) - 1, VOCAB))
    continuation: list[int] = []
    continuation_logprobs: list[float] = []
    for i in range(1, len(ids) + continue_for):
        prev = ids[i - 1]
        unigram[prev] += 1.0
        dist = np.log((bigram[prev] + 2.0 * unigram / unigram.sum()) / (bigram[prev].sum() + 2.0))
        if i < len(ids):
            rows[i - 1] = dist
            tok = ids[i]
        else:
            tok = int(np.argmax(dist))
            ids.append(tok)
            continuation.append(tok)
            continuation_logprobs.append(float(dist[tok]))
        bigram[prev, tok] += 1.0
    return rows, continuation, continuation_logprobs


def bigram_logprobs(token_ids: list[int]) -> np.ndarray:
    """Causal adaptive bigram model with unigram back-off, Laplace-smoothed."""
    ids = np.asarray(token_ids, dtype=np.int64)
    bigram = np.zeros((VOCAB, VOCAB))
    unigram = np.ones(VOCAB)  # add-one prior
    out = np.empty(len(ids) - 1)
    for i in range(1, len(ids)):
        prev, tok = ids[i - 1], ids[i]
        unigram[ids[i - 1]] += 1.0
        p_uni = unigram[tok] / unigram.sum()
        row = bigram[prev]
        p = (row[tok] + 2.0 * p_uni) / (row.sum() + 2.0)
        out[i - 1] = np.log(p)
        bigram[prev, tok] += 1.0
    return out


def _predict(knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    resolved = resolution.predict(knob_values, platform="cuda", spec_method=settings.get("spec_method", "mtp"),
                                  default_max_num_seqs=defaults["default_max_num_seqs"],
                                  max_num_batched_tokens=defaults["max_num_batched_tokens"],
                                  default_runner=defaults["default_runner"])
    return resolved | {"platform": "synthetic", "simulated": True}


def simulated_config(resolved: dict[str, Any]) -> dict[str, Any]:
    """The few fields of vLLM's own resolved config the simulation declares ("<section>.<field>", as the vLLM
    plugin reads them back): the scheduler's limits and the KV cache's block size, an `engine_args.<field>`
    setting its namesake, so that an edge may follow one (engine.fault.edge=cache_config.block_size)."""
    def given(name: str, default: Any) -> Any:
        value = resolved.get(f"engine_args.{name}")
        return default if value is None else value
    return {"cache_config.block_size": given("block_size", 16),
            "compilation_config.max_cudagraph_capture_size": resolved.get("max_capture_size"),
            "scheduler_config.long_prefill_token_threshold": given("long_prefill_token_threshold", 0),
            "scheduler_config.max_model_len": given("max_model_len", 4096),
            "scheduler_config.max_num_batched_tokens": resolved["max_num_batched_tokens"],
            "scheduler_config.max_num_seqs": resolved["max_num_seqs"]}


SIMULATED_FIELDS = [f for f in simulated_config({"max_num_batched_tokens": 1, "max_num_seqs": 1})
                    if f not in ("compilation_config.max_cudagraph_capture_size",
                                 "scheduler_config.max_num_batched_tokens")]


def _named(fault: dict[str, Any], key: str) -> None:
    named = EDGES + list(model_quantities(fault.get("model_config"))) + SIMULATED_FIELDS
    if fault.get(key) is not None and fault[key] not in named:
        raise ConfigError(f"engine.fault.{key}={fault[key]}: not a quantity of the resolved config or a length field "
                          f"of engine.fault.model_config; use one of {', '.join(named)}, or null"
                          + (" for no edge (islands only)" if key == "edge" else ""))


def check_fault(fault: dict[str, Any]) -> None:
    """Refuse a fault shape the engine cannot express, naming the key and the fix."""
    for key in ("edge", "decode_from"):
        _named(fault, key)
    for key in ("edge_offset", "decode_offset"):
        if isinstance(fault.get(key, 0), bool) or not isinstance(fault.get(key, 0), int):
            raise ConfigError(f"engine.fault.{key}={fault[key]}: an integer number of tokens (may be negative)")
    if fault.get("decode_from") is not None and fault.get("decode_from_position") is not None:
        raise ConfigError("engine.fault.decode_from and engine.fault.decode_from_position both set: give the first "
                          "corrupted position as a number or as a quantity (+ decode_offset), not both")
    if fault.get("side", "le") not in SIDES:
        raise ConfigError(f"engine.fault.side={fault['side']}: must be le ({SIDES['le']}), lt ({SIDES['lt']}) "
                          f"or gt ({SIDES['gt']})")
    if (position := fault.get("decode_from_position")) is not None and (isinstance(position, bool) or position < 1):
        raise ConfigError(f"engine.fault.decode_from_position={position}: a token position >= 1 (generated tokens "
                          "at or past it are corrupted), or null")
    if fault.get("target", "prompt") not in TARGETS:
        raise ConfigError(f"engine.fault.target={fault['target']}: must be one of {', '.join(TARGETS)} (what a "
                          "polluted prompt corrupts: its prompt logprobs, its greedy generation, or both)")
    if (switch := fault.get("reference_switch")) is not None and (isinstance(switch, bool) or switch < 1):
        raise ConfigError(f"engine.fault.reference_switch={switch}: a prompt length >= 1 (the reference scores "
                          "prompts of at most that many tokens differently), or null")
    if (above := fault.get("nondeterministic_above")) is not None and (isinstance(above, bool) or above < 0):
        raise ConfigError(f"engine.fault.nondeterministic_above={above}: a number of requests per engine call >= 0 "
                          "(calls of more requests are nondeterministic), or null")
    if (kind := fault.get("malformed")) is not None and kind not in MALFORMED:
        raise ConfigError(f"engine.fault.malformed={kind}: how a polluted prompt's answer is malformed, one of "
                          f"{', '.join(MALFORMED)}, or null (wrong values instead)")
    for island in fault.get("islands") or []:
        if len(island) != 2 or not 1 <= island[0] <= island[1]:
            raise ConfigError(f"engine.fault.islands: {list(island)} is not a range [lo, hi] with 1 <= lo <= hi; "
                              "write e.g. engine.fault.islands=[[300,400]]")


MALFORMED = ("lacking", "missing", "short", "none", "nan", "inf")


def _malformed(result: dict[str, Any], token_ids: list[int], kind: str, topk: int, prompt: bool,
               generation: bool) -> dict[str, Any]:
    """A polluted prompt's answer malformed as `engine.fault.malformed` says, from the middle of the prompt (or
    of the continuation) on, as a broken engine would answer: its rows lacking the prompt's token (`lacking`),
    missing (`missing`), one row short (`short`), no prompt logprobs at all (`none`), NaN (`nan`) or -inf (`inf`)
    values. Row kinds go through the reader vLLM's answers do (engines.answers.prompt_rows)."""
    from oneknob.engines import answers

    result = dict(result)
    if prompt:
        length = len(token_ids)
        start = length // 2
        logprobs = list(result["logprobs"])
        if kind in ("nan", "inf"):
            result["logprobs"] = logprobs[:start - 1] + [math.nan if kind == "nan" else -math.inf] * (length - start)
        else:
            table = result.get("topk") or [[] for _ in logprobs]
            rows: list | None = [None] + [{t: (rank + 1, lp) for rank, (t, lp) in enumerate(row)}
                                          for row in table]  # {token: (rank, logprob)}, vLLM's rows' shape
            for p in range(1, length):
                rows[p].setdefault(token_ids[p], (None, logprobs[p - 1]))
            for p in range(start, length):
                if kind == "lacking":
                    rows[p].pop(token_ids[p], None)
                elif kind == "missing":
                    rows[p] = None
            rows = None if kind == "none" else rows[:-1] if kind == "short" else rows
            result |= answers.prompt_rows(
                rows, token_ids, lambda row, t: row[t][1] if t in row else None,
                lambda row: [(rank, t, lp) for t, (rank, lp) in row.items() if rank is not None], topk)
    if generation and result.get("greedy"):
        n = len(result["greedy"])
        start = n // 2
        if kind == "short":
            result["greedy"], result["greedy_logprobs"] = result["greedy"][:n - 1], result["greedy_logprobs"][:n - 1]
        elif kind in ("nan", "inf"):
            result["greedy_logprobs"] = result["greedy_logprobs"][:start] + [
                math.nan if kind == "nan" else -math.inf] * (n - start)
        else:  # lacking, missing, none: the steps' rows without the generated token's own logprob
            rows = [{t: lp} for t, lp in zip(result["greedy"][:start], result["greedy_logprobs"])]
            decoded = answers.generated(result["greedy"], rows, n, lambda row, t: row.get(t))
            result["greedy_logprobs"] = decoded["greedy_logprobs"]
            result["malformed"] = (result.get("malformed") or {}) | decoded["malformed"]
    return result


class SyntheticFacts:
    name = "synthetic"
    # emulate_cuda_graphs: a study file turns it on for vLLM's CPU build; the simulation has graphs anyway.
    options = ("default_max_num_seqs", "default_runner", "max_num_batched_tokens", "fault", "emulate_cuda_graphs")

    def platform(self) -> str:
        return "synthetic"

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        check_fault(options.get("fault") or {})  # the one look the planner takes at the options
        return {"platform": "synthetic", "default_max_num_seqs": options.get("default_max_num_seqs", 256),
                "default_runner": options.get("default_runner", "v2"),
                "max_num_batched_tokens": options.get("max_num_batched_tokens", 2048)}

    uses_model = False

    def prepare_model(self, model: dict[str, Any]) -> str:
        return model["path"]  # no model: the bigram model needs none

    def tokenizer(self, model_path: str, tokenizer: str | None, overrides: dict | None = None,
                  trust_remote_code: bool = False):
        from oneknob.provision.corpus import BYTES

        return BYTES

    def versions(self, knob_values: dict[str, Any]) -> dict[str, Any]:
        from oneknob import __version__

        return {"oneknob": __version__}

    def model_fingerprint(self, model_path: str, overrides: dict | None = None) -> str:
        return "synthetic" + (f"+{model_override.digest(overrides)}" if overrides else "")

    def preflight(self, worker: dict[str, Any], context: dict[str, Any]) -> None:
        for key in ("vllm.version", "vllm.patch", "vllm.commit"):
            if (value := worker["knobs"].get(key)) is not None:
                raise UnavailableHere(f"{key}={value}: the synthetic engine simulates vLLM's rules and runs no "
                                      f"vLLM build; use engine=vllm to vary {key}, or {key}=null")

    def interpreter(self, knob_values: dict[str, Any], builds_dir: str, log=print,
                    settings: dict | None = None) -> tuple[str, dict[str, str]]:
        return sys.executable, dict(os.environ)

    def validate(self, workers: list[dict[str, Any]], cache_dir: str, log=print,
                 builds_dir: str | None = None, meanwhile=None) -> list[dict]:
        return [{} for _ in workers]  # no engine build to ask: engine_args.* / env.* are recorded as given

    def predict(self, knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict:
        return _predict(knob_values, settings, defaults)


class SyntheticEngine:
    name = "synthetic"

    def start(self, spec: dict[str, Any]) -> None:
        options = spec.get("options", {})
        self.fault = options.get("fault", {})
        if self.fault.get("crash_on_start"):
            print("synthetic: injected crash during start", file=sys.stderr, flush=True)
            os._exit(3)
        self.seed = spec.get("seed", 0)
        self.role = spec.get("role", "job")
        self.resolved = _predict(spec["knobs"], spec.get("settings", {}), SyntheticFacts().defaults(options))
        self.resolved |= knobs.family_values(spec["knobs"])  # ignored by the fault model, recorded as given
        self.resolved["vllm"] = simulated_config(self.resolved)
        # the simulated config.json after the job's model.override.<path> fields: a fault edge model.<path> follows
        self.model_quantities = model_quantities(model_override.applied(self.fault.get("model_config"),
                                                                        model_override.of(spec["knobs"])))
        print(f"synthetic: resolved {self.resolved}", file=sys.stderr, flush=True)
        if model_config := self.fault.get("model_config"):
            # as vLLM warns in its log of what a model's positional scaling does (LongRoPE), once per engine
            print(f"WARNING 01-01 00:00:00 [synthetic.py:1] the simulated model declares {sorted(model_config)}: "
                  "scoring may change at those lengths", file=sys.stderr, flush=True)
        for text in self.fault.get("warnings") or []:  # as vLLM logs them: process, pid, time, file:line
            said = text.format_map(collections.defaultdict(str, self.resolved))
            print(f"(EngineCore pid={os.getpid()}) WARNING {time.strftime('%m-%d %H:%M:%S')} [synthetic.py:2] {said}",
                  file=sys.stderr, flush=True)

    def resolved_config(self) -> dict[str, Any]:
        return dict(self.resolved)

    def provenance(self) -> dict[str, Any]:
        from oneknob import __version__

        return {
            "engine": "synthetic",
            "engine_version": __version__,
            "device": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        }

    def mechanism(self, token_ids: list[int]) -> bool:
        """The fault's conditions, whatever its shape: graphs on, K > 0, a polluting runner (or, with
        `requires_args`, an interaction: every one of those engine arguments as given), the prompt's prefix."""
        r, fault = self.resolved, self.fault
        prefix = fault.get("prompt_prefix")
        if required := fault.get("requires_args"):
            mechanism = all(r.get(f"engine_args.{name}") == value for name, value in required.items())
        else:
            mechanism = (r["cudagraph_mode"] != "NONE" and r["spec_k"] > 0
                         and r["runner"] in fault.get("polluting_runners", ["v1"]))
        return bool(fault.get("pollute", True) and mechanism
                    and not (prefix and token_ids[:len(prefix.encode())] != list(prefix.encode())))

    def quantity(self, name: str | None) -> int | None:
        """A named quantity of this engine: its resolved config's, its simulated config's or its model's."""
        found = derived_quantities(self.resolved) | self.model_quantities | self.resolved["vllm"]
        return found.get(name) if name else None

    def polluted(self, token_ids: list[int], steps: list[int] | None = None) -> bool:
        """The fault model: the mechanism's conditions, then the shape, at the token count of every step that
        scheduled part of the prompt (`steps`; one prompt alone: its length)."""
        if not self.mechanism(token_ids):
            return False
        fault = self.fault
        side = fault.get("side", "le")
        edge = self.quantity(fault.get("edge", "max_capture_size"))
        edge = None if edge is None else edge + fault.get("edge_offset", 0)
        for length in steps or [len(token_ids)]:
            if any(lo <= length <= hi for lo, hi in fault.get("islands") or []):
                return True
            if edge is not None and (length <= edge if side == "le" else length < edge if side == "lt"
                                     else length > edge):
                return True
        return False

    def schedule(self, lengths: list[int]) -> list[dict[str, Any]]:
        """vLLM's scheduling of one call's prompts (prefill only: one generated token is sampled at the end of
        a prompt's prefill): [{"total": tokens, "scheduled": [[index, tokens], ...]}] per step."""
        budget, seqs = self.resolved["max_num_batched_tokens"], self.resolved["max_num_seqs"]
        left, steps = list(lengths), []
        while any(left):
            room, scheduled = budget, []
            for index, remaining in enumerate(left):
                if remaining and room and len(scheduled) < seqs:
                    take = min(remaining, room)
                    scheduled.append([index, take])
                    left[index] -= take
                    room -= take
            steps.append({"total": budget - room, "scheduled": scheduled})
        return steps

    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0) -> dict[str, Any]:
        """Several prompts in one engine call: the scored prompts' logprobs (top-k when asked), judged by the
        fault at the token counts of the steps that scheduled them, and the steps themselves."""
        steps = self.schedule([len(p) for p in prompts])
        self.calls = getattr(self, "calls", 0) + 1
        above = self.fault.get("nondeterministic_above")
        results = {}
        for index in scored:
            totals = [step["total"] for step in steps if any(i == index for i, _ in step["scheduled"])]
            result = self.score(prompts[index], topk=topk, steps=totals)
            if above is not None and len(prompts) > above:  # a batch-variant kernel: differs from call to call
                rng = np.random.default_rng([self.seed, self.calls, index])
                noise = rng.uniform(-1.0, 1.0, size=len(result["logprobs"])) * self.fault.get("nondeterminism", 0.5)
                result["logprobs"] = (np.asarray(result["logprobs"]) - np.abs(noise)).tolist()
            results[index] = result
        return {"results": results, "steps": steps}

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0,
              steps: list[int] | None = None) -> dict[str, Any]:
        """Prompt logprobs, the top-k per position and a greedy continuation; the fault's `target` says
        which of them a polluted prompt corrupts (prompt: the seed's bug, generation, or both)."""
        length = len(token_ids)
        if self.fault.get("crash_at_length") == length:
            print(f"synthetic: injected crash at length {length}", file=sys.stderr, flush=True)
            os._exit(4)
        if self.fault.get("hang_at_length") == length:
            print(f"synthetic: injected hang at length {length}", file=sys.stderr, flush=True)
            time.sleep(10**6)
        if self.fault.get("delay_s"):
            time.sleep(self.fault["delay_s"])
        if any(not 0 <= t < VOCAB for t in token_ids):
            raise ValueError(f"synthetic engine: token ids must be bytes (0..{VOCAB - 1})")
        polluted = self.polluted(token_ids, steps)
        target = self.fault.get("target", "prompt")
        prompt_hit, generation_hit = polluted and target != "generation", polluted and target != "prompt"
        result: dict[str, Any] = {}
        if topk or greedy:
            rows, continuation, continuation_logprobs = bigram_tables(token_ids, greedy)
            logprobs = rows[np.arange(length - 1), np.asarray(token_ids[1:])]
        else:
            rows, continuation, continuation_logprobs, logprobs = None, [], [], bigram_logprobs(token_ids)
        malformed = self.fault.get("malformed")
        if malformed:  # a polluted prompt's answer is malformed instead of wrong in value (_malformed, below)
            prompt_hit, generation_hit = False, False
            bad_prompt = polluted and target != "generation"
            bad_generation = polluted and target != "prompt"
        if prompt_hit and self.fault.get("shift") is not None:
            logprobs = logprobs - self.fault["shift"]
            rows = None if rows is None else rows - self.fault["shift"]
        elif prompt_hit:  # garbage, as if read from an output buffer the drafter overwrote
            rng = np.random.default_rng([self.seed, length, *token_ids[:8]])
            logprobs = -rng.uniform(10.0, 16.0, size=length - 1)
            rows = None if rows is None else -rng.uniform(10.0, 16.0, size=rows.shape)
        switch = self.fault.get("reference_switch")
        if self.role == "reference" and switch is not None and length <= switch:  # the reference-side shape
            logprobs = logprobs - self.fault.get("reference_shift", 0.5)
            rows = None if rows is None else rows - self.fault.get("reference_shift", 0.5)
        result["logprobs"] = logprobs.tolist()
        if topk:
            best = np.argsort(-rows, axis=1, kind="stable")[:, :topk]
            result["topk"] = [[(int(t), float(row[t])) for t in order] for row, order in zip(rows, best)]
        if greedy:
            result["greedy"], result["greedy_logprobs"] = self._generate(token_ids, continuation,
                                                                         continuation_logprobs, generation_hit)
        if malformed and (bad_prompt or bad_generation):
            result = _malformed(result, token_ids, malformed, topk, bad_prompt, bad_generation)
        return result

    def _generate(self, token_ids: list[int], tokens: list[int], logprobs: list[float],
                  generation_hit: bool) -> tuple[list[int], list[float]]:
        """The continuation as the faulted engine returns it: each generated position the fault reaches flips
        its token (garbage logprob), or with `decode_shift` keeps it with its logprob lowered."""
        fault, length = self.fault, len(token_ids)
        start = fault.get("decode_from_position")
        if fault.get("decode_from") is not None:  # a position that follows a quantity
            value = self.quantity(fault["decode_from"])
            start = 10**9 if value is None else value + fault.get("decode_offset", 0)  # none: no decode fault
        if start is not None:
            generation_hit = self.mechanism(token_ids) and fault.get("target", "prompt") != "prompt"
        shift = fault.get("decode_shift")
        rng = np.random.default_rng([self.seed, length, 7, *token_ids[:8]])
        tokens, logprobs = list(tokens), list(logprobs)
        for i in range(len(tokens)):
            if not generation_hit or (start is not None and length + i < start):
                continue
            if shift is not None:
                logprobs[i] -= shift
            else:
                tokens[i], logprobs[i] = (tokens[i] + 1 + i) % VOCAB, -float(rng.uniform(10.0, 16.0))
        return tokens, logprobs

    def close(self) -> None:
        pass
