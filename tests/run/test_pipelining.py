"""Requests sent ahead: the worker finds the next request waiting when it is done with one (oneknob.run.executor).

A job's round knows which lengths it will measure, so EngineSession.expect sends each request before the answer to
the one before is read: the engine goes from one request to the next without waiting for the orchestrator to
judge, journal and record the last. The worker still answers one request at a time, in the order sent, so the
engine sees the same requests and each answer is the one asked for, whatever was sent ahead and not asked for.
"""

from __future__ import annotations

import threading

import pytest
from helpers import job_plan

from oneknob.run import executor
from oneknob.run.executor import EngineSession, Worker, WorkerError


def _worker(tmp_path) -> Worker:
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    return Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "worker.log", start_timeout_s=60,
                  request_timeout_s=120)


def _prompt(length: int, seed: int = 0) -> list[int]:
    return [(i * 7 + seed) % 200 + 1 for i in range(length)]


def _answer(result: dict) -> tuple:
    """What a request's answer says about the prompt (its timing aside)."""
    return result["logprobs"], result.get("topk")


def test_an_answer_collected_after_requests_sent_before_it_is_its_own_and_the_protocol_stays_in_step(tmp_path):
    worker = _worker(tmp_path)
    worker.start()
    try:
        alone = {n: _answer(worker.score(_prompt(n), topk=2)) for n in (300, 400, 500)}
        sent = {n: worker.submit(_prompt(n), topk=2) for n in (300, 400, 500)}
        assert _answer(worker.collect(sent[500])) == alone[500]  # 300's and 400's answers read and dropped
        with pytest.raises(WorkerError, match="no request .* awaits an answer"):
            worker.collect(sent[400])
        assert _answer(worker.score(_prompt(400), topk=2)) == alone[400]  # in step after all that
        assert [_answer(r) for r in worker.score_all([_prompt(n) for n in (500, 300, 400)], topk=2)] == [
            alone[500], alone[300], alone[400]]
    finally:
        worker.stop()


def test_requests_and_answers_larger_than_a_pipe_sent_ahead_do_not_deadlock(tmp_path):
    """Each request here (20,000 tokens) and each answer (with its top-2 rows) exceeds a pipe's 64 KiB: a blocking
    write of the second request, while the worker blocks writing the first answer nobody reads yet, would hang
    both processes. The writes wait for room while the answer is read (Worker._pump)."""
    worker = _worker(tmp_path)
    worker.start()
    prompts = [_prompt(20_000, seed) for seed in range(3)]
    results: list = []
    scoring = threading.Thread(target=lambda: results.extend(worker.score_all(prompts, topk=2)), daemon=True)
    try:
        scoring.start()
        scoring.join(timeout=90)
        hung = scoring.is_alive()
        if hung:
            worker.proc.kill()  # ends a blocked write (broken pipe) and the thread with it
            scoring.join(timeout=30)
        assert not hung, "sending requests ahead deadlocked with the worker"
        assert [len(r["logprobs"]) for r in results] == [19_999] * 3
        assert [r["topk"][0] for r in results] == [worker.score(p, topk=2)["topk"][0] for p in prompts]
    finally:
        worker.stop()


def test_a_session_sends_what_a_round_expects_ahead_and_drops_what_is_not_asked_for(tmp_path, monkeypatch):
    """EngineSession.expect: the engine receives the announced requests in order, one ahead of the answer awaited;
    a score() of something else gets its own answer (the one sent ahead is dropped), and later ones are sent as
    they are asked for."""
    sent: list[int] = []
    send = Worker._send

    def sending(self, message):
        if message["op"] == "score":
            sent.append(len(executor.unpack(message["tokens"], "q")))
        send(self, message)

    monkeypatch.setattr(Worker, "_send", sending)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    session = EngineSession(plan, tmp_path / "job", progress=_Quiet())
    lengths = (300, 400, 500, 600)
    try:
        alone = {n: _answer(session.score(_prompt(n))) for n in lengths}
        sent.clear()
        session.expect([_prompt(n) for n in lengths])
        assert _answer(session.score(_prompt(300))) == alone[300]
        assert sent == [300, 400]  # 400 went out before 300's answer was read
        assert _answer(session.score(_prompt(400))) == alone[400] and sent == [300, 400, 500]
        assert _answer(session.score(_prompt(600))) == alone[600]  # not 500, sent ahead: it is dropped
        assert sent == [300, 400, 500, 600]  # and nothing more is announced
        assert _answer(session.score(_prompt(500))) == alone[500] and sent[4:] == [500]
    finally:
        session.stop()


class _Quiet:
    """A job's progress line, unseen."""

    def engine_wait(self, elapsed_s, phase):
        pass

    def engine_ready(self, ready):
        pass
