"""A worker's two pipes as one channel of JSON lines, whose writes never block.

Requests may be sent before the answer to the one before is read (executor.Worker.submit): a write that blocked
on a full pipe while the worker blocks writing an answer nobody reads would hang both processes, so what the pipe
does not take at once waits here and goes out whenever the channel waits for an answer (`pump`).
"""

from __future__ import annotations

import json
import os
import selectors
from collections import deque
from typing import IO


class Closed(Exception):
    """The other end is gone: a write found no reader, or a read found the end of the pipe."""


class Channel:
    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]):
        self.stdin, self.stdout = stdin, stdout
        os.set_blocking(stdin.fileno(), False)
        self._out = bytearray()  # what is sent but not yet in the pipe (it was full)
        self._lines: deque[bytes] = deque()  # whole lines read but not yet taken
        self._partial = b""  # the last line read, while it is not whole
        self._writing = False  # stdin is registered for room in the pipe
        self._selector = selectors.DefaultSelector()
        self._selector.register(stdout, selectors.EVENT_READ)

    @property
    def sending(self) -> bool:
        """Something sent is still waiting for room in the pipe."""
        return bool(self._out)

    def send(self, message: dict) -> None:
        """Queue a message and write what the pipe takes now."""
        self._out += (json.dumps(message) + "\n").encode()
        self._write()

    def take(self) -> dict | None:
        """The next message read, if a whole one is here."""
        return json.loads(self._lines.popleft()) if self._lines else None

    def pump(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the other end: read what it wrote, write what waits for room."""
        for key, _ in self._selector.select(timeout=wait_s):
            if key.fileobj is self.stdin:
                self._write()
                continue
            data = os.read(self.stdout.fileno(), 1 << 20)
            if not data:
                raise Closed("end of the pipe")
            *lines, self._partial = (self._partial + data).split(b"\n")
            self._lines.extend(line for line in lines if line.strip())

    def _write(self) -> None:
        try:
            self._out[:os.write(self.stdin.fileno(), self._out)] = b""
        except BlockingIOError:
            pass
        except OSError as exc:  # BrokenPipeError: the reader is gone
            raise Closed(str(exc)) from None
        if bool(self._out) != self._writing:  # wake on a pipe with room only while something waits for it
            self._writing = bool(self._out)
            if self._writing:
                self._selector.register(self.stdin, selectors.EVENT_WRITE)
            else:
                self._selector.unregister(self.stdin)

    def close(self) -> None:
        self._selector.close()
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass
