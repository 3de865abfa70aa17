"""Devices: the GPUs a study's engines run on, never two engines on one device at once.

    devices=auto       every GPU nvidia-smi lists, or those CUDA_VISIBLE_DEVICES already limits this process to;
                       one device on a host without GPUs (CUDA_VISIBLE_DEVICES left alone, as before)
    devices=4          the first 4 of those
    devices=[0,2,3]    those (as CUDA_VISIBLE_DEVICES names them: indexes, or GPU-/MIG- UUIDs)

`resolve` turns the setting into a `Placement`: the device sets engines get, model.tensor_parallel_size devices
each. Every engine (a job's, the reference's, a bisection probe's, a follow-up's) runs in a worker whose
CUDA_VISIBLE_DEVICES is its set (`env`), set before the engine is imported; `Pool` hands the sets out, one
holder at a time, first come first served, so a job waits for a free set instead of sharing one. On a host
without GPUs the synthetic engine takes logical devices (`devices=[0,1,2,3]`: the worker's CUDA_VISIBLE_DEVICES
is set and recorded, nothing reads it), so placement is tested without a GPU; vLLM's CPU build keeps one (its
engines share the host's cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from oneknob.errors import ConfigError
from oneknob.run import stopping

_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]+")
HOST = "host"  # the label of the one device of a host without GPUs (no CUDA_VISIBLE_DEVICES set)


@cache
def _nvidia_smi(path: str) -> tuple[str, ...] | None:
    """The GPUs nvidia-smi lists, as indexes (their order is PCI bus order, CUDA_DEVICE_ORDER=PCI_BUS_ID's)."""
    try:
        out = subprocess.run([path, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(line.strip() for line in out.splitlines() if line.strip().isdigit())


def visible(env: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The GPUs this process may give its engines: CUDA_VISIBLE_DEVICES's entries where it is set (an index
    nvidia-smi does not list is dropped), else every GPU nvidia-smi lists; None where there is no nvidia-smi
    (a host without GPUs)."""
    env = os.environ if env is None else env
    path = shutil.which("nvidia-smi", path=env.get("PATH"))
    listed = _nvidia_smi(path) if path else None
    if listed is None:
        return None
    limit = env.get("CUDA_VISIBLE_DEVICES")
    if limit is None:
        return listed
    named = [d.strip() for d in limit.split(",") if d.strip()]
    return tuple(d for d in named if not d.isdigit() or d in listed)


@dataclass(frozen=True)
class Placement:
    """Where a study's engines may run: `sets`, each the devices one engine gets."""
    devices: tuple[str, ...]  # () = the host's one device: nothing is set
    per_engine: int
    sets: tuple[tuple[str, ...], ...]
    logical: bool = False  # no GPU here: ids that are set and recorded, and that nothing reads (synthetic)
    notes: tuple[str, ...] = ()
    how: str = ""  # where the devices came from, in words

    @property
    def placed(self) -> bool:
        return bool(self.devices)

    def text(self) -> str:
        """"4 devices (0,1,2,3: devices=[0,1,2,3], logical), 1 per engine: 4 engines at once"."""
        if not self.placed:
            return f"one device ({self.how}): one engine at a time"
        logical = ", logical: no GPU here, CUDA_VISIBLE_DEVICES set and recorded only" if self.logical else ""
        return (f"{len(self.devices)} device(s) ({','.join(self.devices)}: {self.how}{logical}), "
                f"{self.per_engine} per engine: {len(self.sets)} engine(s) at once")

    def as_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "per_engine": self.per_engine, "sets": [list(s) for s in self.sets],
                "logical": self.logical, "how": self.how, "notes": list(self.notes)}


def _asked(value: Any) -> str | int | list[str]:
    """The setting as "auto", a count or a list of ids; refused when it is none of them."""
    fix = "use devices=auto, a count (devices=4) or a list of GPU ids (devices=[0,2,3])"
    typed = _shown(value)  # as the user wrote it
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"devices={json.dumps(value)}: not a device setting; {fix}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"devices={value}: at least one device; {fix}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return text
        if text.isdigit():
            return _asked(int(text))
        value = [part for part in text.split(",") if part.strip()]  # as CUDA_VISIBLE_DEVICES writes them
    if isinstance(value, (list, tuple)):
        ids = [str(v).strip() for v in value]
        if not ids or any(isinstance(v, (bool, float)) or v is None for v in value) or not all(ids):
            raise ConfigError(f"devices={typed}: not a list of GPU ids; {fix}")
        # what CUDA_VISIBLE_DEVICES takes: an index, or a GPU-/MIG- UUID (CUDA reads no further than an entry it
        # cannot read: devices=[-1] or [abc] would hide every GPU, and a job would run on none)
        unread = [i for i in ids if not (i.isdigit() or _UUID.fullmatch(i))]
        if unread:
            raise ConfigError(f"devices={typed}: {', '.join(unread)} {'is' if len(unread) == 1 else 'are'} not a GPU "
                              "id (an index as nvidia-smi lists it, 0 or more, or a GPU-/MIG- UUID); " + fix)
        ids = [str(int(i)) if i.isdigit() else i for i in ids]  # 01 is GPU 1
        if len(set(ids)) < len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"devices={typed}: {', '.join(twice)} named twice; one engine per "
                              "device, so each device is listed once")
        return ids
    raise ConfigError(f"devices={value!r}: not a device setting; {fix}")


def _shown(value: Any) -> str:
    """The setting as written on Hydra's command line: devices=[0,2,3], devices=auto, devices=null."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def resolve(value: Any, *, platform: str, per_engine: int = 1, env: Mapping[str, str] | None = None) -> Placement:
    """The placement `devices=value` asks for on this host, for engines of `per_engine` devices each
    (model.tensor_parallel_size); refused (ConfigError naming the key, the value and the fix) where it cannot
    hold. `platform`: the plan's (cpu: vLLM's CPU build, one device whatever is asked, said in a note)."""
    asked, shown = _asked(value), _shown(value)
    gpus = visible(env)
    if platform == "cpu":
        notes = () if asked == "auto" or asked in (1, ["0"]) else (
            f"devices={shown}: vLLM's CPU build runs on this host's cores, which its engines share, so devices "
            "stays one here (one engine at a time); on a GPU host each engine gets devices of its own",)
        return Placement((), per_engine, ((),), notes=notes, how="vLLM's CPU build")
    if gpus is None or not gpus:  # no GPU here: one device, or logical ones that only the simulation takes
        if asked == "auto":
            why = "no nvidia-smi here" if gpus is None else "CUDA_VISIBLE_DEVICES hides every GPU"
            return Placement((), per_engine, ((),), how=f"devices=auto, {why}")
        ids = [str(i) for i in range(asked)] if isinstance(asked, int) else asked
        return _sets(tuple(ids), per_engine, shown, logical=True, how=f"devices={shown}")
    if asked == "auto":
        limited = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env.get("CUDA_VISIBLE_DEVICES")
        how = f"devices=auto: CUDA_VISIBLE_DEVICES={limited}" if limited is not None else \
            f"devices=auto: the {len(gpus)} GPU(s) nvidia-smi lists"
        return _sets(gpus, per_engine, shown, how=how)
    if isinstance(asked, int):
        if asked > len(gpus):
            raise ConfigError(f"devices={asked}: only {len(gpus)} GPU(s) visible here ({','.join(gpus)}); use "
                              f"devices=auto or at most devices={len(gpus)}")
        return _sets(gpus[:asked], per_engine, shown, how=f"devices={asked}: the first {asked} visible")
    missing = [d for d in asked if d not in gpus]
    if missing:
        raise ConfigError(f"devices={shown}: {', '.join(missing)} not among the GPUs visible here "
                          f"({','.join(gpus)}: nvidia-smi's indexes, limited by CUDA_VISIBLE_DEVICES where set); "
                          "name visible ones, or devices=auto")
    return _sets(tuple(asked), per_engine, shown, how=f"devices={shown}")


def _sets(devices: tuple[str, ...], per_engine: int, shown: str, *, how: str, logical: bool = False) -> Placement:
    if per_engine < 1:
        raise ConfigError(f"model.tensor_parallel_size={per_engine}: an engine spans at least one device")
    if per_engine > len(devices):
        raise ConfigError(f"model.tensor_parallel_size={per_engine} needs {per_engine} devices per engine, but "
                          f"devices={shown} gives {len(devices)} ({','.join(devices)}); give at least {per_engine}, "
                          f"or lower model.tensor_parallel_size")
    count = len(devices) // per_engine
    sets = tuple(devices[i * per_engine:(i + 1) * per_engine] for i in range(count))
    idle = devices[count * per_engine:]
    notes = (f"devices {','.join(idle)} stay idle: engines of model.tensor_parallel_size={per_engine} take "
             f"{per_engine} each",) if idle else ()
    return Placement(devices, per_engine, sets, logical=logical, notes=notes, how=how)


def env(devices: tuple[str, ...] | list[str] | None, base: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker on these devices gets: CUDA_VISIBLE_DEVICES, and CUDA_DEVICE_ORDER=PCI_BUS_ID where
    unset, so an index means the GPU nvidia-smi lists under it (CUDA's own default order puts the fastest first);
    nothing for the host's one device."""
    if not devices:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)} | (
        {} if "CUDA_DEVICE_ORDER" in base else {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})


def label(environment: Mapping[str, str]) -> str:
    """The device a worker with this environment runs on, as recorded: its CUDA_VISIBLE_DEVICES, or `host` where
    none is set. In a Slurm job (slurm_gpu: Slurm placed it) what Slurm gave, with its node: `node7:0`, and the
    GPUs by the node's numbering where Slurm renumbered them for the job (`node7:0 (node's GPU 3)`: SLURM_STEP_GPUS,
    else SLURM_JOB_GPUS)."""
    given = environment.get("CUDA_VISIBLE_DEVICES")
    shown = HOST if given is None else given or "none"
    if not environment.get("SLURM_JOB_ID"):
        return shown
    node = environment.get("SLURMD_NODENAME") or socket.gethostname()
    numbered = environment.get("SLURM_STEP_GPUS") or environment.get("SLURM_JOB_GPUS")
    return f"{node}:{shown}" + (f" (node's GPU {numbered})" if numbered and numbered != given else "")


# (sweep dir, job index) -> what frees that job's device set: a job's engines stop before its bookkeeping (result
# files, MLflow), which needs no device, so the set goes to the next job as soon as they have (engines_stopped)
_on_engines_stopped: dict[tuple[str, int], Any] = {}
_on_engines_stopped_lock = threading.Lock()


def when_engines_stop(sweep_dir: str, index: int, free) -> None:
    """Call `free()` when job `index` of the sweep in `sweep_dir` says its engines have stopped."""
    with _on_engines_stopped_lock:
        _on_engines_stopped[(str(sweep_dir), index)] = free


def engines_stopped(sweep_dir: str, index: int) -> None:
    """Job `index`'s engines (its own, its reference's, its scorer's) have stopped and their processes are reaped:
    its device set may go to the next job while it writes its results. Nothing where no sweep placed it."""
    with _on_engines_stopped_lock:
        free = _on_engines_stopped.pop((str(sweep_dir), index), None)
    if free is not None:
        free()


@dataclass
class Lease:
    holder: str
    devices: tuple[str, ...]
    acquired: float
    released: float | None = None


@dataclass
class Pool:
    """The free device sets of a placement, handed out first come first served: `lease(holder)` waits (a sweep's
    interrupt ends the wait: oneknob.run.stopping) until the set first in line is free and holds it until the
    block ends. `leases` keeps every lease, for the sweep's record (placement.json)."""
    sets: tuple[tuple[str, ...], ...]
    leases: list[Lease] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free = list(self.sets)
        self._line: deque[object] = deque()
        self._changed = threading.Condition()

    def acquire(self, holder: str) -> Lease:
        ticket = object()
        with self._changed:
            self._line.append(ticket)
            try:
                while self._line[0] is not ticket or not self._free:
                    self._changed.wait(0.2)
                    stopping.check()
            except BaseException:
                self._line.remove(ticket)
                self._changed.notify_all()
                raise
            self._line.popleft()
            devices = self._free.pop(0)
            lease = Lease(holder, devices, time.time())
            self.leases.append(lease)
            self._changed.notify_all()
            return lease

    def release(self, lease: Lease) -> None:
        """Free the lease's set (once: a second release of the same lease does nothing)."""
        with self._changed:
            if lease.released is not None:
                return
            lease.released = time.time()
            self._free.append(lease.devices)
            self._free.sort(key=self.sets.index)  # the lowest set first: the same placement from run to run
            self._changed.notify_all()

    @contextlib.contextmanager
    def lease(self, holder: str) -> Iterator[Lease]:
        lease = self.acquire(holder)
        try:
            yield lease
        finally:
            self.release(lease)

    def most_at_once(self) -> int:
        """The most leases held at one time."""
        edges = sorted([(lease.acquired, 1) for lease in self.leases]
                       + [(lease.released or time.time(), -1) for lease in self.leases], key=lambda e: (e[0], e[1]))
        most = held = 0
        for _, step in edges:
            held += step
            most = max(most, held)
        return most


def of(placed: tuple[str, ...] | list[str] | None, environment: Mapping[str, str] | None = None) -> str:
    """The device of a job placed on `placed` (JobPlan.devices), else of this process (Slurm's, or the host)."""
    return ",".join(placed) if placed else label(os.environ if environment is None else environment)
