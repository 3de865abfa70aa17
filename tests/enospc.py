"""A full disk on demand, without privileges: writes to chosen paths fail with ENOSPC.

    disk = FullDisk(["*/job/points.csv"])           # fnmatch patterns on absolute paths
    disk.install(monkeypatch)                       # in process
    env = full_disk_env("*/s/0/points.csv")         # a subprocess: tests/enospc_site/sitecustomize.py installs it

Opening a matching path for writing succeeds (the file is created, as on a real full disk) and every write
to it raises OSError(ENOSPC), as does `os.replace` onto it (MLflow's artifact store writes a staging file it
opens with os.open, then renames it). With `trigger`, the disk fills on the first write whose data contains
it (e.g. a journal's first point record); from then on every write to a matching path fails, as a full disk
stays full. `fileno()` is refused once full, so shutil's copies fall back to write() and fail there too.
"""

from __future__ import annotations

import builtins
import errno
import fnmatch
import io
import os
from pathlib import Path

ENV = "ONEKNOB_TEST_FULL_DISK"  # os.pathsep-separated patterns


def full_disk_env(*patterns: str) -> dict[str, str]:
    here = Path(__file__).parent
    return {ENV: os.pathsep.join(patterns),
            "PYTHONPATH": os.pathsep.join([str(here / "enospc_site"), str(here), os.environ.get("PYTHONPATH", "")])}


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
    def __init__(self, real, disk: FullDisk):
        self._real, self._disk = real, disk

    def write(self, data):
        if self._disk.full or (self._disk.trigger is not None and self._disk.trigger in _text(data)):
            self._disk.full = True
            raise _enospc()
        return self._real.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def fileno(self):
        if self._disk.full:  # shutil then copies with write()
            raise io.UnsupportedOperation("fileno")
        return self._real.fileno()

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __iter__(self):
        return iter(self._real)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, (bytes, bytearray, memoryview)) else str(data)


class FullDisk:
    def __init__(self, patterns, trigger: str | None = None):
        self.patterns = list(patterns)
        self.trigger = trigger
        self.full = trigger is None
        self.hits: list[str] = []  # the paths it refused

    def matches(self, file, mode: str) -> bool:
        if isinstance(file, int) or not any(c in mode for c in "wax+"):
            return False
        path = os.path.abspath(os.fspath(file))
        return any(fnmatch.fnmatch(path, pattern) for pattern in self.patterns)

    def wrap(self, real_open):
        def open_(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            if not self.matches(file, mode):
                return handle
            self.hits.append(os.fspath(file))
            return _FullFile(handle, self)
        return open_

    def wrap_replace(self, real_replace):
        def replace(src, dst, **kwargs):
            if self.full and self.matches(dst, "w"):
                self.hits.append(os.fspath(dst))
                raise _enospc()
            return real_replace(src, dst, **kwargs)
        return replace

    def install(self, monkeypatch=None) -> None:
        patches = [(builtins, "open", self.wrap(builtins.open)), (io, "open", self.wrap(builtins.open)),
                   (os, "replace", self.wrap_replace(os.replace))]
        for module, name, patched in patches:
            if monkeypatch is not None:
                monkeypatch.setattr(module, name, patched)
            else:
                setattr(module, name, patched)
