"""What a user pastes or types is masked, bounded and checked before anything starts: credentials never stored or
printed, a parse never older than the files it read, a pasted file bounded and text, numbers finite and in range,
messages naming what the user wrote, and clean-builds deleting nothing outside oneknob's own folders. Each
refusal exits 2 before any engine starts (test_hostile_files_and_signals's _refused); each test failed before
the fix it names.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest
from helpers import run_cli
from test_hostile_files_and_signals import _refused

from oneknob.config import resolution, tracking
from oneknob.config.schema import REPO_ROOT
from oneknob.engines.vllm import validate as vllm_validate
from oneknob.errors import ConfigError, Refused
from oneknob.plan import from_command as fc
from oneknob.provision import clean_builds
from oneknob.study import flag_reduction

MODEL = REPO_ROOT / "models" / "tiny-mtp"
SMALL = ("lengths=[200,300]", "samples=1", "dry_run=true")


# -- credentials ---------------------------------------------------------------------------------------------------

@pytest.mark.slow  # vLLM's parser reads the line (once per machine: the parse is copied into the study's cache,
# which is searched with every other file), one job
def test_credentials_in_a_pasted_line_are_never_written_or_printed(tmp_path):
    """`HF_TOKEN=... vllm serve M --api-key ...` was written verbatim into report.md, summary.json, the journal,
    MLflow and the parse cache, while the report said "not carried"."""
    values = ("hf_FakeToken4711", "sk-FakeKey4712", "hf_FakeToken4713")
    line = (f"HF_TOKEN={values[0]} vllm serve {MODEL} --api-key {values[1]} --hf-token {values[2]} "
            "--max-num-seqs 8")
    rc, out = run_cli(tmp_path, f"from_command={line}", "lengths=[200,300]", "samples=1", "search.suspects=false",
                      f"hydra.sweep.dir={tmp_path}/s", multirun=True, timeout=600)
    assert rc == 0, out
    assert not [v for v in values if v in out], out
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any("vllm-command" in str(p) for p in written)  # the parse cache is among them
    leaked = [(str(p), v) for p in written for v in values if v.encode() in p.read_bytes()]
    assert leaked == [], leaked  # files, the MLflow store (SQLite) and its artifacts
    report = (tmp_path / "s" / "report.md").read_text()
    for flag in ("--api-key", "--hf-token", "HF_TOKEN="):
        assert f"{flag} not carried: a secret (masked as ***" in out.replace("\n", " "), flag
    assert "--api-key ***" in report and "HF_TOKEN=***" in report


def test_a_tracking_uri_holding_a_password_is_refused_without_echoing_it(monkeypatch):
    """tracking.uri=http://user:PASSWORD@host was echoed whole in the refusal, and would be written into plan.json,
    the journal, every printed compare / sync / retry line and MLflow's tags."""
    for uri in ("http://bob:hunter2pw@127.0.0.1:5000", "https://bob:hunter2pw@mlflow.example.org/prefix"):
        with pytest.raises(tracking.TrackingError) as refused:
            tracking.resolve_uri(uri, "mlruns")
        said = str(refused.value)
        assert "hunter2pw" not in said and said.startswith("tracking.uri=" + uri.replace("hunter2pw", "***")), said
        assert "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD" in said
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(tracking.TrackingError) as refused:
            tracking.resolve_uri(None, "mlruns")
        assert "hunter2pw" not in str(refused.value) and str(refused.value).startswith("MLFLOW_TRACKING_URI=")
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.resolve_uri("http://bob@127.0.0.1:5000", "mlruns") == "http://bob@127.0.0.1:5000"  # no password


# -- a parse is keyed by what it read ------------------------------------------------------------------------------

def test_a_line_is_parsed_again_when_a_file_it_reads_changes(tmp_path, monkeypatch):
    """A line's --config file changed to max_num_seqs: 16, and every new study still planned 4: the parse was
    cached by the line's text."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    asked = []

    def parser(python, env, command, spec, *args, **kwargs):  # vLLM's parser, as oneknob's cache sees it
        asked.append(spec)
        seqs = int(Path(spec["argv"][2]).read_text().split(":")[1])
        return {"ok": True, "model": "m", "vllm_version": "0.32.0", "flags": [
            {"dest": "max_num_seqs", "option": "--max-num-seqs", "value": seqs, "default": None,
             "deprecated": False, "engine_arg": True}]}

    monkeypatch.setattr(vllm_validate, "run_script", parser)
    config = tmp_path / "cfg.yaml"
    line = f"vllm serve m --config {config}"
    seqs = []
    for value in (4, 16, 16):
        config.write_text(f"max_num_seqs: {value}\n")
        found = fc.parse(line, "python", {}, fc.script_runner(str(tmp_path / f"study-{value}"), "build"))
        seqs.append(found.flags[0].value)
    assert seqs == [4, 16, 16] and len(asked) == 2  # asked again once the file changed, not for the same file
    assert asked[0]["reads"] != asked[1]["reads"]
    # a model file of gigabytes (vllm serve model.gguf) is keyed by its size and time, never read whole each plan
    weights = tmp_path / "model.gguf"
    with weights.open("wb") as out:
        out.truncate(fc.HASHED_BYTES + 1)
    read_whole = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read_whole.append(self) or b"")
    assert fc.reads([str(weights)]) == {str(weights): f"{fc.HASHED_BYTES + 1} bytes, modified "
                                                      f"{weights.stat().st_mtime_ns}"} and read_whole == []


# -- input bounded before it is parsed -----------------------------------------------------------------------------

def test_a_pasted_file_is_bounded_and_text_and_a_line_asking_for_help_is_refused(tmp_path):
    """A 3 MB from_command=@file hung with no output (shlex is quadratic in one long word), a binary one ended in a
    UnicodeDecodeError traceback, and --help gave the tail of vLLM's help text cut mid-word."""
    (tmp_path / "big.txt").write_text(f"vllm serve {MODEL} --max-num-seqs " + "8" * 3_000_000)
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 40)
    rc, out = run_cli(tmp_path, "from_command=@big.txt", *SMALL, multirun=True, timeout=60)
    _refused(rc, out, tmp_path, "from_command=@big.txt: the file holds 3,000,0", "at most 100,000 characters")
    rc, out = run_cli(tmp_path, "from_command=@binary.txt", *SMALL, multirun=True, timeout=60)
    _refused(rc, out, tmp_path, "from_command=@binary.txt: not a text file (byte 0x80 at offset 128 is no UTF-8)")
    with pytest.raises(ConfigError, match=r"the line is 200,017 characters; a command line is at most 100,000"):
        fc.read(f"vllm serve m --x {'y' * 200_000}")
    for asked in ("--help", "-h", "--version", "--help=all"):
        with pytest.raises(ConfigError, match=rf"asks vLLM for {asked}, which prints text and starts nothing.* "
                                              rf"drop {asked} from the line"):
            fc.split(f"vllm serve m --max-num-seqs 8 {asked}")


# -- nothing deleted outside oneknob's folders ---------------------------------------------------------------------

def _build(folder: Path, days_old: float) -> Path:
    folder.mkdir(parents=True)
    marker = folder / clean_builds.MARK
    marker.write_text("{}")
    then = time.time() - days_old * 86400
    os.utime(marker, (then, then))
    return folder


def test_clean_builds_deletes_nothing_outside_its_folders_and_takes_only_a_finite_number_of_days(tmp_path, capsys):
    """Reached through a symlinked kind folder, clean-builds deleted a marked build outside the cache; --days nan
    and 1e400 were taken ("unused for more than nan day(s)")."""
    cache = tmp_path / "cache"
    mine = _build(cache / "builds" / "old", 30)
    outside = _build(tmp_path / "elsewhere" / "commits" / "old", 30)
    kept = _build(tmp_path / "elsewhere" / "patched" / "linked", 30)
    (cache / "commits").symlink_to(outside.parent, target_is_directory=True)  # a kind folder that is a link
    (cache / "patched").mkdir()
    (cache / "patched" / "linked").symlink_to(kept, target_is_directory=True)  # a build that is a link
    assert clean_builds.main(["--cache", str(cache)]) == 0
    said = capsys.readouterr().out
    assert not mine.exists() and outside.is_dir() and kept.is_dir(), said
    assert f"skipping {cache}/commits: a symbolic link (to {outside.parent})" in said
    assert "1 build(s) of oneknob unused for more than 14 day(s)" in said
    for days in ("nan", "1e400", "inf", "-1", "two"):
        with pytest.raises(SystemExit) as refused:
            clean_builds.main(["--days", days, "--cache", str(cache), "--dry-run"])
        assert refused.value.code == 2
        assert f"--days: {days!r}: give a finite number of days >= 0" in capsys.readouterr().err
    assert isinstance(clean_builds._days("2.5"), float) and pytest.raises(argparse.ArgumentTypeError,
                                                                            clean_builds._days, "nan")


# -- numbers and names read whole and checked ----------------------------------------------------------------------

def test_a_device_a_length_field_and_a_prompt_past_the_model_are_checked_whole(tmp_path):
    """engine.target_gpu='H100 or A100' planned for H100 (only its first word was read); model.override.<length
    field>=-1 or =10**23 was planned on the synthetic engine, which vLLM's own check refuses on engine=vllm."""
    for given in ("H100 or A100", "nvidia b200 ; rm -rf /"):
        rc, out = run_cli(tmp_path, f"engine.target_gpu='{given}'", *SMALL, engine="vllm")
        _refused(rc, out, tmp_path, f"engine.target_gpu={given}: not one device of oneknob's table; give one of "
                                    "A100, L40S, H100")
    for spelled, device in (("NVIDIA H100 80GB HBM3", "H100"), ("nvidia h200 nvl", "H200"), ("b200", "B200"),
                            ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 PCIe", "H100")):
        assert resolution.device_named(spelled).name == device, spelled  # what nvidia-smi adds still matches
    assert not resolution.same_device("H100 or A100", "NVIDIA H100 80GB HBM3")
    fault = "engine.fault.model_config={max_position_embeddings: 4096}"
    for value in ("-1", "0", "100000000000000000000000"):
        rc, out = run_cli(tmp_path, fault, f"model.override.max_position_embeddings={value}", *SMALL)
        _refused(rc, out, tmp_path, f"model.override.max_position_embeddings={value}: max_position_embeddings "
                                    "is a length in tokens", "so it takes an integer from 1 to 2,147,483,647")
    rc, out = run_cli(tmp_path, "model.max_model_len=100", *SMALL)  # the simulation agrees with vLLM's check
    _refused(rc, out, tmp_path, "lengths: 300 needs model.max_model_len >= 301", "but it is 100")


def test_messages_name_what_the_user_wrote_and_quote_a_long_value_shortly():
    """A line's --hf-overrides was refused naming engine_args.hf_overrides, a key the user never typed; its
    --max-model-len 100 as model.max_model_len, not saying it came from the line; a 9000-character tag echoed whole."""
    line = fc.Line("vllm serve m --hf-overrides ...", "serve", "m", [fc.Flag(
        "hf_overrides", "--hf-overrides", {"rope_scaling": {"factor": 2.0}}, None)])
    with pytest.raises(ConfigError) as refused:
        fc.assign(line, {})
    assert "engine_args" not in str(refused.value)
    assert str(refused.value).endswith("drop --hf-overrides from the line and add "
                                       "model.override.rope_scaling.factor=2.0")
    line = fc.Line("vllm serve m --max-model-len 100", "serve", "m",
                   [fc.Flag("max_model_len", "--max-model-len", 100, None)])
    fc.assign(line, {})
    with pytest.raises(ConfigError) as refused, flag_reduction.from_line(line):
        raise ConfigError("lengths: 300 needs model.max_model_len >= 301, but it is 100; raise model.max_model_len")
    assert "(model.max_model_len came from the from_command line's --max-model-len 100: change it in the line" in \
        str(refused.value)
    for tag in ("k:" + "v" * 9000, "k" * 9000):
        with pytest.raises(Refused) as refused:
            tracking.user_tags([tag])
        assert len(str(refused.value)) < 400 and "characters)]" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        resolution.device_named("H" * 9000)
    assert len(str(refused.value)) < 400 and "(9000 characters)" in str(refused.value)


def test_a_sweep_json_oneknob_cannot_read_is_never_replaced(tmp_path):
    """A sweep.json that is no record of oneknob's ('{not json', a list, another tool's) was taken as no claim at
    all and overwritten by the next sweep into that directory."""
    from oneknob.study import sweep_dir

    for n, text in enumerate(("{not json", "[1, 2]", "")):
        folder = tmp_path / str(n)
        folder.mkdir()
        (folder / "sweep.json").write_text(text)
        with pytest.raises(ConfigError) as refused:
            sweep_dir.claim(folder, "abc", "python run.py -m x=1,2")
        assert "is not a sweep record oneknob can read" in str(refused.value)
        assert (folder / "sweep.json").read_text() == text
    fresh = tmp_path / "fresh"  # a directory without one is claimed, and its record written
    assert sweep_dir.claim(fresh, "abc", "python run.py -m x=1,2") is None
    assert '"sweep_id": "abc"' in (fresh / "sweep.json").read_text()
    sweep_dir.release(fresh)
