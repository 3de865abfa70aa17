"""from_command=<a bug report's line> without a real engine: the line split as a shell would, Hydra's quoting of
it, ddmin on predicates (an interaction found exactly, within its estimate), vLLM 0.32.0's own `vllm serve` parser
reading good and bad lines (one subprocess), and through the CLI on the synthetic engine: a two-flag interaction
reduced to exactly those two flags, drop=each's table, the minimal run reusing drop=each's jobs, and refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run_cli

from oneknob.config.schema import REPO_ROOT
from oneknob.errors import ConfigError
from oneknob.plan import from_command as fc
from oneknob.study.flag_reduction import ddmin

LINE = ("vllm serve {model} --enable-prefix-caching --block-size 32 --max-num-seqs 256 --seed 3 --port 8001 "
        "--max-num-batched-tokens 1024 --speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": 3}}'")
INTERACTION = ["+engine.fault.requires_args={enable_prefix_caching:true,block_size:32}", "engine.fault.edge=null",
               "engine.fault.islands=[[1,4096]]", "lengths=[256,512]", "samples=1", "search.suspects=false"]


# -- the line as a shell splits it --------------------------------------------------------------------

def test_lines_as_people_paste_them():
    assert fc.split("vllm serve m --max-num-seqs 128 --speculative-config '{\"method\": \"mtp\"}'") == (
        "serve", {}, ["m", "--max-num-seqs", "128", "--speculative-config", '{"method": "mtp"}'])
    assert fc.split("$ VLLM_USE_V2_MODEL_RUNNER=0 vllm serve m \\\n  --enforce-eager  # eager") == (
        "serve", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, ["m", "--enforce-eager"])
    assert fc.split("python3 -m vllm.entrypoints.openai.api_server --model m")[2] == ["--model", "m"]
    assert fc.split("llm = LLM(model='m', max_num_seqs=8)")[0] == "llm"
    assert fc.llm_call("llm = vllm.LLM('m', speculative_config={'method': 'mtp', 'num_speculative_tokens': 3})") == (
        "m", {"speculative_config": {"method": "mtp", "num_speculative_tokens": 3}})
    with pytest.raises(ConfigError, match="not a literal value"):
        fc.llm_call("LLM(model=path)")
    with pytest.raises(ConfigError, match="not a `vllm serve ...` line"):
        fc.split("docker run vllm/vllm-openai")
    with pytest.raises(ConfigError, match="its quotes"):
        fc.split("vllm serve m --x '{")
    for empty in ("", "   ", None):
        with pytest.raises(ConfigError, match="from_command is empty"):
            fc.read(empty)


def test_from_file_and_hydra_quoting(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (tmp_path / "line.txt").write_text("vllm serve m \\\n --max-num-seqs 8\n")
    assert fc.read(f"@{tmp_path}/line.txt") == "vllm serve m \\\n --max-num-seqs 8"
    with pytest.raises(ConfigError, match="cannot read it"):
        fc.read(f"@{tmp_path}/missing.txt")
    for text in ["vllm serve m --sc '{\"a\": 1}' --x a\\b \"q\\\"\" \\", "it's ${x} $HOME", "a\n \\\n b"]:
        rewritten = fc.rewrite_argument(f"from_command={text}")
        (override,) = OverridesParser.create().parse_overrides([rewritten])
        assert override.key_or_group == "from_command.line"
        assert override.value() == text.replace("${", "\\${")  # OmegaConf reads \${ as a literal ${


def test_the_minimal_line_is_a_vllm_serve_line():
    flags = [fc.Flag("speculative_config", "--speculative-config", {"method": "mtp", "num_speculative_tokens": 3},
                     None), fc.Flag("enable_prefix_caching", "--enable-prefix-caching", True, None),
             fc.Flag("enforce_eager", "--enforce-eager", False, None)]
    assert fc.serve_line("m", flags) == ("vllm serve m --speculative-config "
                                         "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' "
                                         "--enable-prefix-caching --no-enforce-eager")


# -- ddmin ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5, 8, 12])
def test_ddmin_finds_every_pair_and_single_within_its_estimate(n):
    import itertools
    import math

    items = [f"f{i}" for i in range(n)]
    culprits = [set(pair) for pair in itertools.combinations(items, 2)] + [{item} for item in items]
    for culprit in culprits:
        asked: set[frozenset] = set()

        def breaks(subset, culprit=culprit, asked=asked):
            asked.add(frozenset(subset))
            return culprit <= set(subset)

        assert set(ddmin(items, breaks)) == culprit
        assert len(asked) + 2 <= 2 + n * (math.ceil(math.log2(n)) + 1)  # + the baseline and the empty set


def test_ddmin_stops_when_a_probe_cannot_answer():
    assert ddmin(["a", "b", "c", "d"], lambda subset: None) == ["a", "b", "c", "d"]


# -- vLLM's own parser (one subprocess, no engine) ------------------------------------------------------

@pytest.mark.slow  # one import of vLLM's parser (20-80 s here)
def test_vllm_reads_good_lines_and_refuses_bad_ones_with_its_own_message(tmp_path):
    runner = fc.script_runner(str(tmp_path), "test")
    lines = {"report": "vllm serve models/tiny-mtp --speculative-config '{\"method\": \"mtp\", "
                       "\"num_speculative_tokens\": 3}' --max-num-seqs 128 --max-num-batched-tokens 4096 "
                       "--enable-prefix-caching --port 9",
             "unknown": "vllm serve m --max-num-seqz 128",
             "json": "vllm serve m --speculative-config '{\"method\": mtp}'",
             "two": "vllm serve a b",
             "both": "vllm serve a --model b",
             "server": "python -m vllm.entrypoints.openai.api_server --model m --compilation-config "
                       "'{\"max_cudagraph_capture_size\": 256}' --no-enable-prefix-caching"}
    found = runner(sys.executable, {}, "serve", {"batch": [{"argv": fc.split(t)[2]} for t in lines.values()]})
    by = dict(zip(lines, found["results"]))
    assert by["report"]["model"] == "models/tiny-mtp" and by["report"]["vllm_version"] == "0.32.0"
    flags = {f["dest"]: f for f in by["report"]["flags"]}
    assert list(flags) == ["speculative_config", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
                           "port"]
    assert flags["speculative_config"]["value"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert flags["enable_prefix_caching"]["value"] is True and flags["enable_prefix_caching"]["default"] is None
    assert flags["port"]["engine_arg"] is False and flags["max_num_seqs"]["engine_arg"] is True
    assert "unrecognized arguments: --max-num-seqz" in by["unknown"]["refused"]
    assert "argument --speculative-config" in by["json"]["refused"] and "cannot be converted" in by["json"]["refused"]
    assert "unrecognized arguments: b" in by["two"]["refused"]
    assert "two models" in by["both"]["refused"]
    server = {f["dest"]: f for f in by["server"]["flags"]}
    assert by["server"]["model"] == "m" and server["compilation_config"]["value"] == {"max_cudagraph_capture_size": 256}
    assert server["enable_prefix_caching"]["value"] is False and server["enable_prefix_caching"]["option"] == \
        "--enable-prefix-caching"
    # the line as oneknob assigns it: the server's defaults for max_num_seqs / max_num_batched_tokens on CPU
    line = fc.Line(lines["report"], "serve", "models/tiny-mtp", [
        fc.Flag(f["dest"], f["option"], f["value"], f["default"],
                status="ablated" if f["engine_arg"] else "not carried") for f in by["report"]["flags"]])
    fc.assign(line, {"default_max_num_seqs": 128, "max_num_batched_tokens": 2048})
    assert [(f.name, f.knob, f.knob_value, f.reset) for f in line.ablated] == [
        ("speculative_config", "spec.k", 3, 0), ("max_num_batched_tokens", "engine_args.max_num_batched_tokens",
                                                 4096, 2048),
        ("enable_prefix_caching", "engine_args.enable_prefix_caching", True, None)]
    assert {f.name: f.status for f in line.flags}["max_num_seqs"] == "default"
    assert line.overrides == ["spec.method=mtp"]


# -- through the CLI, synthetic engine -----------------------------------------------------------------

def _summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


@pytest.mark.slow
def test_a_two_flag_interaction_is_reduced_to_exactly_those_two(tmp_path):
    model = REPO_ROOT / "models" / "tiny-mtp"  # a checkpoint directory (the synthetic engine loads nothing); a fixed
    # line, so vLLM's reading of it is cached on the machine (~/.cache/oneknob/vllm-checks) after the first run
    code, out = run_cli(tmp_path, f"from_command=vllm serve {model} --max-num-seqz 8", "from_command.drop=each",
                        multirun=True, timeout=600)
    assert code == 2 and "refuses the line: unrecognized arguments: --max-num-seqz 8" in out, out
    assert not (tmp_path / "multirun").exists()
    line = LINE.format(model=model)
    code, out = run_cli(tmp_path, f"from_command={line}", "from_command.drop=each", *INTERACTION,
                        f"hydra.sweep.dir={tmp_path}/each", multirun=True, timeout=600)
    assert code == 0, out
    each = _summary(tmp_path / "each")["from_command"]
    assert each["each"] == {"enable_prefix_caching": "cleared", "block_size": "cleared",
                            "max_num_batched_tokens": "unchanged", "speculative_config": "unchanged"}
    assert each["flags"]["max_num_seqs"]["status"] == "default" and each["flags"]["seed"]["status"] == "setting"
    assert each["flags"]["port"]["status"] == "not carried"
    report = (tmp_path / "each" / "report.md").read_text()
    assert report.split("\n## ")[1].startswith("The reporter's flags")
    assert "| `--block-size` | 32 | null | cleared |" in report

    code, out = run_cli(tmp_path, f"from_command={line}", "from_command.drop=minimal", *INTERACTION,
                        f"hydra.sweep.dir={tmp_path}/minimal", multirun=True, timeout=600)
    assert code == 0, out
    found = _summary(tmp_path / "minimal")["from_command"]
    assert found["minimal"] == ["enable_prefix_caching", "block_size"]
    assert found["minimal_line"] == f"vllm serve {model} --enable-prefix-caching --block-size 32"
    assert out.rstrip().splitlines()[-1] == f"minimal line: {found['minimal_line']}"  # the terminal's last line
    assert found["engine_starts"] <= found["bound"]
    # the probes that drop one flag are drop=each's jobs: from the cache, no engine start for them
    singles = [p for p in found["probes"] if len(p["kept"]) == len(found["ablated"]) - 1]
    assert found["engine_starts"] == found["jobs"] - 1 - len(singles), found["probes"]


def test_bad_lines_are_refused_before_anything_starts(tmp_path):
    code, out = run_cli(tmp_path, "from_command=", multirun=True)
    assert code == 2 and "from_command is empty" in out and "nothing was started" in out
    code, out = run_cli(tmp_path, "from_command=vllm serve m")
    assert code == 2 and "add -m" in out
    code, out = run_cli(tmp_path, "from_command=vllm serve m", "from_command.drop=all", multirun=True)
    assert code == 2 and "from_command.drop=all" in out
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "multirun").exists()
