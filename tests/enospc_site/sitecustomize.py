"""Installs tests/enospc.py's full disk in a subprocess (the CLI and its workers) when its variable is set."""

import os

if os.environ.get("ONEKNOB_TEST_FULL_DISK"):
    import enospc

    enospc.FullDisk(os.environ["ONEKNOB_TEST_FULL_DISK"].split(os.pathsep)).install()
