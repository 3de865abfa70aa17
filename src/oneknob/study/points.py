"""Measuring and judging one point of the axes other than prompt length (oneknob.plan.axis).

    batch    the probe (corpus sample s, `probe_length` tokens) first, then its neighbours, in ONE engine call;
             prompt logprobs of the probe only; the engine says which tokens each step scheduled. The probe is
             judged against the reference's prefix of the same sample (the reference scores the probe alone),
             and labelled with its schedule (verdict.agreement.co_scheduling).
    repeat   `concurrency` identical requests in one engine call, `repeats` calls; every output is judged
             against the first (identical | within tolerance | differs); no reference.

A point's record (the point cache's, keyed by the axis too: plan.JobPlan.cache_key) holds what the engine
returned, so a cached point is judged exactly as a fresh one.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from oneknob.plan.axis import Axis
from oneknob.provision.corpus import Corpus
from oneknob.verdict import agreement
from oneknob.verdict.judge import Point, judge


def neighbour_prompts(axis: Axis, corpus: Corpus, value: int, sample: int) -> list[list[int]]:
    """The neighbours of one batch point: each from another corpus sample than the probe's where there is one, at
    an offset of its own (point, neighbour, sample), so no neighbour shares a first block with the probe or an
    earlier point's neighbour (an engine's prefix cache would then skip part of it, and the step would be
    smaller than claimed; the recorded steps would say so)."""
    prompts = []
    for index, length in enumerate(axis.neighbours(value)):
        tokens = corpus.samples[(sample + 1 + index) % len(corpus.samples)]
        room = max(1, len(tokens) - length + 1)
        offset = (1 + 37 * value + 101 * index + 13 * sample) % room
        prompts.append(list(tokens[offset:offset + length]))
    return prompts


def measure_batch(session, axis: Axis, corpus: Corpus, value: int, sample: int, topk: int) -> dict[str, Any]:
    """One batch point, measured: {"logprobs", "topk"?, "steps", "seconds"} of the probe."""
    prompts = [corpus.prompt(axis.probe_length, sample), *neighbour_prompts(axis, corpus, value, sample)]
    started = time.perf_counter()
    done = session.batch(prompts, [0], topk=topk)
    probe = done["results"][0]
    return {**probe, "steps": done["steps"], "prompts": len(prompts), "seconds": time.perf_counter() - started}


def measure_repeat(session, axis: Axis, corpus: Corpus, value: int, sample: int) -> dict[str, Any]:
    """One repeat point: `value` identical requests per engine call, `axis.repeats` calls, every output kept."""
    prompt = corpus.prompt(axis.probe_length, sample)
    started, outputs, steps = time.perf_counter(), [], []
    malformed: dict[str, str] = {}
    for _ in range(axis.repeats):
        done = session.batch([prompt] * value, list(range(value)), topk=0)
        outputs += [done["results"][i]["logprobs"] for i in range(value)]
        for i in range(value):  # the first reason of each field: every repeat answers the same prompt
            malformed = (done["results"][i].get("malformed") or {}) | malformed
        steps.append([step["total"] for step in done["steps"]])
    return {"logprobs": outputs[0], "repeats": outputs, "steps": steps, "seconds": time.perf_counter() - started,
            **({"malformed": malformed} if malformed else {})}


def judge_batch(axis: Axis, value: int, sample: int, record: dict[str, Any], reference, plan, cached: bool) -> Point:
    """The probe judged against the reference's prefix, then labelled with what its step held."""
    probe = axis.probe_length
    point = judge(probe, sample, record["logprobs"], record["seconds"],
                  reference.prefix(sample, probe) if reference else None, plan.verdict, cached=cached,
                  oracles=plan.oracles, topk=record.get("topk"),
                  reference_topk=reference.prefix_topk(sample, probe) if reference and record.get("topk") else None,
                  malformed=record.get("malformed"))
    schedule = agreement.co_scheduling(record["steps"], record.get("prompts", 1 + len(axis.neighbours(value))),
                                       axis.step_tokens(value))
    return replace(point, length=value, **schedule)


def judge_repeat(axis: Axis, value: int, sample: int, record: dict[str, Any], plan, cached: bool) -> Point:
    """The worst repeat against the first: polluted (for the search) when it differs beyond verdict.tol_token."""
    outputs = record["repeats"]
    if record.get("malformed"):  # a repeat answered wrongly: no agreement to measure, the point is polluted
        point = judge(axis.probe_length, sample, outputs[0], record["seconds"], None, plan.verdict, cached=cached,
                      malformed=record["malformed"])
        return replace(point, length=value, polluted=True, nll_polluted=True, agreement=agreement.DIFFERS)
    label, deviation, worst = agreement.repeats_agreement(outputs, plan.verdict.tol_token)
    point = judge(axis.probe_length, sample, outputs[worst], record["seconds"], outputs[0], plan.verdict,
                  cached=cached)
    differs = label == agreement.DIFFERS
    return replace(point, length=value, polluted=differs, nll_polluted=differs, agreement=label,
                   max_abs_delta=deviation)


def agreement_text(points: list[Point]) -> str | None:
    """"identical" / "within tolerance (max 0.0012 nats)" / "differs (max 0.49 nats)" over a point's samples."""
    labels = [p.agreement for p in points if p.agreement is not None]
    if not labels:
        return None
    worst = max(labels, key=[agreement.IDENTICAL, agreement.WITHIN, agreement.DIFFERS].index)
    deviation = max(p.max_abs_delta or 0.0 for p in points)
    return worst if worst == agreement.IDENTICAL else f"{worst} (max {deviation:.3g} nats)"
