"""/proc reads shared by the executor and its worker hosts."""

from __future__ import annotations

from pathlib import Path


def proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent PID, state, start time in clock ticks) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]
