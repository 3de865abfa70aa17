"""Bad input is refused before any engine starts, naming the key, the value and the fix; nothing is recorded.

Each case runs the real CLI (a one-knob sweep, so the sweeper's pre-flight
check is what refuses) in its own directory; afterwards no worker was ever
started and no run reached FINISHED.
"""

import json
import os

import pytest
from helpers import mlflow_runs, run_cli, worker_records

SWEEP = "cudagraph.capture=256,512"


def _model_without_mtp(tmp_path):
    model = tmp_path / "no-mtp-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    return model  # no tokenizer, no weights: the check must come before either is needed


CASES = {
    # Hydra's own refusals (structured config): the message is Hydra's and names the key; exit 2 like ours.
    "unknown key": (lambda t: ["cudagraph.captur=256"], 2,
                    ["cudagraph.captur=256: cudagraph.captur is not a knob or a setting",
                     "did you mean cudagraph.capture? Write cudagraph.capture=256"]),
    "unknown key outside the knob groups": (lambda t: ["verdict.tol_nl=0.1"], 2,
                                            ["Key 'tol_nl' not in 'VerdictConfig'",
                                             "did you mean verdict.tol_nll? Write verdict.tol_nll=0.1"]),
    "wrong type": (lambda t: ["spec.k=three"], 2, ["spec.k=three", "could not be converted to Integer"]),
    "unknown group option": (lambda t: ["engine=bogus"], 2, ["Could not find 'engine/bogus'"]),
    # oneknob's refusals: exit code 2, key=value and the fix.
    "two knobs varied": (lambda t: ["spec.k=0,3", SWEEP], 2,
                         ["varies 2 knobs", "spec.k over 0,3", "'+ablation.spec.k=[0,3]'"]),
    "a knob list and a setting list": (lambda t: [SWEEP, "samples=1,2"], 2,
                                       ["varies the knob cudagraph.capture and also samples=1,2"]),
    "+ on a knob": (lambda t: ["+spec.k=2"], 2, ["'+' on spec.k is refused", "write spec.k=2"]),
    "++ on a knob": (lambda t: ["++runner=v2"], 2, ["'++' on runner is refused", "write runner=v2"]),
    "~ on a knob": (lambda t: ["~runner"], 2, ["'~' on runner is refused", "write runner=VALUE"]),
    "+ on a knob typo": (lambda t: ["+cudagraph.captur=256"], 2,
                         ["'+' on cudagraph.captur is refused", "did you mean cudagraph.capture?"]),
    "+ under a knob group": (lambda t: ["+sched.foo=1"], 2, ["'+' on sched.foo is refused", "sched.foo is not a knob"]),
    "capture <= 0": (lambda t: ["cudagraph.capture=0,256"], 2,
                     ["cudagraph.capture=0: must be a positive integer, or null for the engine's default"]),
    "spec.k < 0": (lambda t: ["spec.k=-1"], 2, ["spec.k=-1: the number of speculative tokens must be >= 0"]),
    "max_num_seqs <= 0": (lambda t: ["sched.max_num_seqs=0"], 2,
                          ["sched.max_num_seqs=0: must be a positive integer"]),
    "K > 0 without MTP layers": (
        lambda t: ["engine=vllm", f"model.path={_model_without_mtp(t)}", "model.build=null", "spec.k=1"], 2,
        ["spec.k=1: model", "has no MTP layers", "num_nextn_predict_layers", "use spec.k=0"]),
    "unknown runner": (lambda t: ["runner=v3"], 2, ["runner=v3: must be v1, v2 or null"]),
    "bisect neither true nor false": (lambda t: ["bisect=yes"], 2,
                                      ["bisect=yes: bisect is true or false", "bisect.criterion=verdicts|"]),
    "bisect swept": (lambda t: ["bisect=true,false"], 2, ["bisect=true,false: bisect is true or false, one value"]),
    "length < 2": (lambda t: ["lengths=[1,256]"], 2, ["lengths: 1 is too short", ">= 2 tokens"]),
    "duplicated length": (lambda t: ["lengths=[256,512,256]"], 2,
                          ["lengths: [256] appear more than once", "list each length once"]),
    "length above max_model_len": (
        lambda t: ["engine=vllm", f"model.path={_model_without_mtp(t)}", "model.build=null", "spec.k=0",
                   "lengths=[256,4096]", "corpus.sample_tokens=8192"], 2,
        ["lengths: 4096 needs model.max_model_len >= 4097", "but it is 2048", "raise model.max_model_len"]),
    "length above a corpus sample": (lambda t: ["lengths=[256,4096]"], 2,
                                     ["lengths: 4096 is longer than a corpus sample",
                                      "corpus.sample_tokens=2048", "raise corpus.sample_tokens"]),
    # issue 22: a 1000-length grid whose budget ran out at 65 said "all polluted over 2..1001 (1000 lengths)"
    "grid above the probe budget": (lambda t: ["lengths=[128,256,384]", "search.max_probes=2"], 2,
                                    ["lengths: 3 lengths but search.max_probes=2", "raise search.max_probes to at "
                                     "least 3"]),
    # issue 25: the axes
    "unknown axis": (lambda t: ["axis=neighbours"], 2, ["axis=neighbours: unknown axis", "use axis=length"]),
    "batch without a probe": (lambda t: ["axis=batch", "batch.neighbours=[0,1]"], 2,
                              ["batch.probe_length=null: axis=batch needs the probe's prompt length",
                               "e.g. batch.probe_length=200"]),
    "batch with both axes": (lambda t: ["axis=batch", "batch.probe_length=200", "batch.neighbours=[0,1]",
                                        "batch.neighbour_lengths=[0,100]"], 2,
                             ["batch.neighbours and batch.neighbour_lengths: both given", "set the other to null"]),
    "batch with a negative neighbour length": (lambda t: ["axis=batch", "batch.probe_length=200",
                                                          "batch.neighbour_lengths=[0,-100]"], 2,
                                               ["batch.neighbour_lengths=-100: must be an integer >= 0"]),
    "repeat once": (lambda t: ["axis=repeat", "repeat.n=1"], 2,
                    ["repeat.n=1: must be an integer >= 2", "e.g. repeat.n=3"]),
    # issue 22: nan compares false with everything, so a nan tolerance judged every length clean
    "verdict.tol_nll nan": (lambda t: ["verdict.tol_nll=nan"], 2, ["verdict.tol_nll=nan: must be a finite number"]),
    "verdict.max_nll inf": (lambda t: ["reference=null", "verdict.max_nll=inf"], 2,
                            ["verdict.max_nll=inf: must be a finite number"]),
    "verdict.tol_token -inf": (lambda t: ["verdict.tol_token=-inf"], 2,
                               ["verdict.tol_token=-inf: must be a finite number"]),
    "verdict.rtol_nll nan": (lambda t: ["verdict.rtol_nll=nan"], 2, ["verdict.rtol_nll=nan: must be a finite number"]),
    "empty corpus": (lambda t: [f"corpus.path={(t / 'empty.txt').resolve()}"], 2,
                     ["corpus.path=", "empty.txt: the file is empty", "give a text file with content"]),
    "unreadable corpus": (lambda t: [f"corpus.path={t}"], 2,
                          ["corpus.path=TMP: not a regular file", "give a readable UTF-8 text file"]),
    "missing corpus": (lambda t: [f"corpus.path={t}/nothing.txt"], 2,
                       ["nothing.txt: cannot read it (No such file or directory)"]),
    "missing model path": (lambda t: ["engine=vllm", f"model.path={t}/no-model", "model.build=null"], 2,
                           ["model.path=TMP/no-model: no such model directory", "or model=tiny"]),
    # root ignores chmod, so the unwritable place is one below a regular file
    "unwritable mlruns": (lambda t: [f"paths.mlruns={t}/afile/mlruns"], 2,
                          ["paths.mlruns=TMP/afile/mlruns: cannot write there (Not a directory)",
                           "set paths.mlruns / tracking.uri elsewhere"]),
    "malformed tracking uri": (lambda t: ["tracking.uri=mlflow-at-localhost:5000"], 2,
                               ["tracking.uri=mlflow-at-localhost:5000: not a tracking URI",
                                "sqlite:///<absolute path>/mlflow.db, http://host:port"]),
    # reliability round two (issue 14): checked before any engine, exit 2, nothing recorded
    "file store uri": (lambda t: [f"tracking.uri=file://{t}/x"], 2,
                       ["tracking.uri=file://TMP/x: MLflow refuses the plain file store", "sqlite:///"]),
    "unwritable sqlite store": (lambda t: [f"tracking.uri=sqlite:///{t}/afile/m.db"], 2,
                                ["tracking.uri=sqlite:///TMP/afile/m.db: the tracking store cannot be used",
                                 "fix the URI or the permissions"]),
    "empty experiment name": (lambda t: ["tracking.experiment=''"], 2,
                              ["tracking.experiment='': an MLflow experiment needs a printable name"]),
    "huge experiment name": (lambda t: [f"tracking.experiment={'x' * 10000}"], 2,
                             ["tracking.experiment='xxxx", "1 to 200 characters"]),
    "hub id not on this machine": (lambda t: ["engine=vllm", "model.path=nosuch/model", "model.build=null",
                                              "spec.k=0"], 2,
                                   ["model.path=nosuch/model: no tokenizer could be loaded from it"]),
    "model dir without a tokenizer": (lambda t: ["engine=vllm", f"model.path={_model_without_mtp(t)}",
                                                 "model.build=null", "spec.k=0"], 2,
                                      ["model.path=TMP/no-mtp-model: no tokenizer could be loaded"]),
    "garbage spec.method": (lambda t: ["engine=vllm", f"spec.method={'m' * 10000}"], 2,
                            ["spec.method='mmmm", "not a vLLM speculative method name"]),
    "unknown dtype": (lambda t: ["engine=vllm", "model.dtype=bogus"], 2,
                      ["model.dtype=bogus: vLLM loads weights as one of auto"]),
    "unknown reference dtype": (lambda t: ["engine=vllm", "reference_engine=transformers", "reference_dtype=float99"],
                                2, ["reference_dtype=float99: use one of float32"]),
    "empty lengths (brackets survive the console)": (lambda t: ["lengths=[]"], 2,
                                                     ["lengths=[]: give at least one prompt length, "
                                                      "e.g. lengths=[256,512,1024]"]),
    "negative request timeout": (lambda t: ["engine.request_timeout_s=-1"], 2,
                                 ["engine.request_timeout_s=-1.0: must be > 0 seconds"]),
    "engine.extra (gone) on a knob's kwarg": (lambda t: ["engine=vllm", "+engine.extra.enforce_eager=true"], 2,
                                              ["engine.extra.enforce_eager: engine.extra is gone",
                                               "write cudagraph.enforce_eager=true"]),
    "engine.extra (gone)": (lambda t: ["engine=vllm", "+engine.extra.block_size=16"], 2,
                            ["engine.extra.block_size: engine.extra is gone", "write engine_args.block_size=16"]),
    "engine_args on a named knob's field": (lambda t: ["engine_args.max_num_seqs=4"], 2,
                                            ["engine_args.max_num_seqs: the named knob sched.max_num_seqs sets it"]),
    "engine_args inside a named knob's mapping": (
        lambda t: ["engine_args.compilation_config={max_cudagraph_capture_size:8}"], 2,
        ["compilation_config.max_cudagraph_capture_size is cudagraph.capture's"]),
    "+ on a family knob": (lambda t: ["+engine_args.block_size=16"], 2,
                           ["'+' on engine_args.block_size is refused", "write engine_args.block_size=16"]),
    "engine_args the worker sets from model.*": (lambda t: ["engine=vllm", "engine_args.max_model_len=64"], 2,
                                                 ["engine_args.max_model_len: oneknob sets max_model_len itself"]),
    "unwritable cache": (lambda t: [f"paths.cache={t}/afile/cache"], 2,
                         ["paths.cache=TMP/afile/cache: cannot write there (Not a directory)"]),
    "corpus /dev/zero": (lambda t: ["corpus.path=/dev/zero"], 2, ["corpus.path=/dev/zero: not a regular file"]),
    "corpus fifo": (lambda t: [f"corpus.path={_fifo(t)}"], 2, ["corpus.path=TMP/fifo: not a regular file"]),
    "binary corpus": (lambda t: [f"corpus.path={_binary(t)}"], 2,
                      ["corpus.path=TMP/random.bin:", "characters are not UTF-8 text (a binary file?)"]),
    "no room for the generated token": (lambda t: ["engine=vllm", "lengths=[2048]", "spec.k=0"], 2,
                                        ["lengths: 2048 needs model.max_model_len >= 2049"]),
    "fault model on vllm": (lambda t: ["engine=vllm", "engine.fault.crash_at_length=250"], 2,
                            ["engine.fault.crash_at_length: engine=vllm does not read it",
                             "it belongs to engine=synthetic"]),
    # issue 27: engine=vllm_server's own setting, and engine settings it does not read
    "server.clients=0": (lambda t: ["engine=vllm_server", "server.clients=0"], 2,
                         ["server.clients=0: the number of concurrent HTTP clients must be an integer >= 1",
                          "use server.clients=1"]),
    "server.clients above one": (
        lambda t: ["engine=vllm_server", "server.clients=4"], 2,
        ["server.clients=4: a point's concurrent requests are the axis' own", "use server.clients=1"]),
    "server.clients on the offline engine": (lambda t: ["engine=vllm", "server.clients=2"], 2,
                                             ["server.clients=2: engine=vllm does not read it",
                                              "it belongs to engine=vllm_server"]),
    "fault model on vllm_server": (lambda t: ["engine=vllm_server", "engine.fault.crash_at_length=250"], 2,
                                   ["engine.fault.crash_at_length: engine=vllm_server does not read it",
                                    "it belongs to engine=synthetic"]),
    "engine.extra (gone) on vllm_server": (lambda t: ["engine=vllm_server", "+engine.extra.block_size=16"], 2,
                                           ["engine.extra.block_size: engine.extra is gone"]),
    "vllm build knob on the synthetic engine": (lambda t: ["vllm.patch=fix"], 2,
                                                ["vllm.patch=fix: the synthetic engine", "use engine=vllm"]),
    "version that is no version": (lambda t: ["engine=vllm", "vllm.version=latest"], 2,
                                   ["vllm.version=latest: not a release, a pinned vllm requirement"]),
    "patch that is missing": (lambda t: ["engine=vllm", "vllm.patch=no-such-fix"], 2,
                              ["vllm.patch=no-such-fix: no such patch file"]),
}


def _fifo(tmp):
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _binary(tmp):
    (tmp / "random.bin").write_bytes(bytes(range(256)) * 400)
    return tmp / "random.bin"


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_any_engine_starts(tmp_path, case):
    overrides, code, expected = CASES[case]
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "afile").write_text("a regular file")
    given = overrides(tmp_path)
    swept = any(o.startswith("cudagraph.capture=") for o in given)
    rc, out = run_cli(tmp_path, *given, *([] if swept else [SWEEP]), multirun=True)
    assert rc == code, out
    for text in (e.replace("TMP", str(tmp_path)) for e in expected):
        assert text in out, f"{case}: {text!r} not in:\n{out}"
    assert "nothing was started and no run was recorded" in out
    assert worker_records(tmp_path) == [], "an engine was started"
    assert mlflow_runs(tmp_path) == [], "a run was recorded"
    assert "Traceback" not in out
