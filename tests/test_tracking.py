"""The tracking store's pre-flight under concurrency (no MLflow server needed)."""

import multiprocessing as mp

from oneknob.tracking import resolve_uri


def _probe_many(mlruns: str, times: int) -> None:
    for _ in range(times):
        resolve_uri(None, mlruns)


def test_concurrent_sweeps_do_not_trip_each_others_write_probe(tmp_path):
    """Two sweeps starting at once on one fresh mlruns/ must both pass the writability check."""
    context = mp.get_context("fork")
    workers = [context.Process(target=_probe_many, args=(str(tmp_path / "mlruns"), 300)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert list((tmp_path / "mlruns").iterdir()) == []  # every probe cleaned up
