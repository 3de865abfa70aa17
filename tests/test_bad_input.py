"""Bad input is refused before any engine starts, naming the key, the value and the fix; nothing is recorded.

Each case runs the real CLI (a one-knob sweep, so the sweeper's pre-flight
check is what refuses) in its own directory; afterwards no worker was ever
started and no run reached FINISHED.
"""

import json

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
    "unknown key": (lambda t: ["cudagraph.captur=256"], 2, ["cudagraph.captur", "Key 'captur' not in"]),
    "wrong type": (lambda t: ["spec.k=three"], 2, ["spec.k=three", "could not be converted to Integer"]),
    "unknown group option": (lambda t: ["engine=bogus"], 2, ["Could not find 'engine/bogus'"]),
    # oneknob's refusals: exit code 2, key=value and the fix.
    "two knobs varied": (lambda t: ["spec.k=0,3", SWEEP], 2,
                         ["varies 2 knobs", "spec.k over 0,3", "'+ablation.spec.k=[0,3]'"]),
    "a knob list and a setting list": (lambda t: [SWEEP, "samples=1,2"], 2,
                                       ["varies the knob cudagraph.capture and also samples=1,2"]),
    "+ on a knob": (lambda t: ["+spec.k=2"], 2, ["'+' on spec.k is refused", "write spec.k=VALUE"]),
    "++ on a knob": (lambda t: ["++runner=v2"], 2, ["'++' on runner is refused", "write runner=VALUE"]),
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
    "length < 2": (lambda t: ["lengths=[1,256]"], 2, ["lengths: 1 is too short", ">= 2 tokens"]),
    "duplicated length": (lambda t: ["lengths=[256,512,256]"], 2,
                          ["lengths: [256] appear more than once", "list each length once"]),
    "length above max_model_len": (
        lambda t: ["engine=vllm", f"model.path={_model_without_mtp(t)}", "model.build=null", "spec.k=0",
                   "lengths=[256,4096]", "corpus.sample_tokens=8192"], 2,
        ["lengths: 4096 is above model.max_model_len=2048", "raise model.max_model_len"]),
    "length above a corpus sample": (lambda t: ["lengths=[256,4096]"], 2,
                                     ["lengths: 4096 is longer than a corpus sample",
                                      "corpus.sample_tokens=2048", "raise corpus.sample_tokens"]),
    "empty corpus": (lambda t: [f"corpus.path={(t / 'empty.txt').resolve()}"], 2,
                     ["corpus.path=", "empty.txt: the file is empty", "give a text file with content"]),
    "unreadable corpus": (lambda t: [f"corpus.path={t}"], 2,
                          ["corpus.path=TMP: cannot read it (Is a directory)", "give a readable text file"]),
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
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_any_engine_starts(tmp_path, case):
    overrides, code, expected = CASES[case]
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "afile").write_text("a regular file")
    given = overrides(tmp_path)
    swept = any(o.startswith("cudagraph.capture=") for o in given)
    rc, out = run_cli(tmp_path, *given, *([] if swept else [SWEEP]), multirun=True, template_store=False)
    assert rc == code, out
    for text in (e.replace("TMP", str(tmp_path)) for e in expected):
        assert text in out, f"{case}: {text!r} not in:\n{out}"
    assert "nothing was started and no run was recorded" in out
    assert worker_records(tmp_path) == [], "an engine was started"
    assert mlflow_runs(tmp_path) == [], "a run was recorded"
    assert "Traceback" not in out
