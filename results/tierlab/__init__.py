"""tierlab: the lab's Python side -- results format, reports, and (in later issues)
the paired runner and the VM lab. Run as `tierlab SUBCOMMAND` (build/bin/tierlab)
or `/usr/bin/python3 -m tierlab`.

Every error a user can cause (missing file, bad JSON, a document that breaks the
schema, bad gate bounds) is raised as LabError with a one-line message; the command
line prints it and exits 2, never with a traceback."""

from __future__ import annotations

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = RESULTS_DIR.parent


class LabError(Exception):
    """A user-facing error: the message is one line and says what to fix."""
