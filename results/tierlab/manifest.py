"""Manifests for Python producers (the workload folders): the same facts tierprobe
records in C++ (workloads/probe/host.cc) -- host, kernel, the mount the target
directory lives on, git commit -- plus the lab's run coordinates (arm, pair, boot,
fault profile, device layout), which come from command-line options every
workload's run script shares through add_run_options()."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from tierlab import REPO_ROOT, LabError


def iso_from_unix(seconds: float) -> str:
    t = dt.datetime.fromtimestamp(max(0.0, seconds), dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def iso_now() -> str:
    return iso_from_unix(dt.datetime.now(dt.timezone.utc).timestamp())


def _unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and all(c in "01234567" for c in s[i + 1:i + 4]):
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def find_mount(mountinfo: str, path: str) -> dict[str, str] | None:
    """The mount of `path` (absolute, resolved) in /proc/self/mountinfo text: the
    longest mount point that is a path prefix; later lines win ties."""
    best: dict[str, str] | None = None
    for line in mountinfo.splitlines():
        f = line.split()
        if "-" not in f[6:]:
            continue
        dash = f.index("-", 6)
        if dash + 2 >= len(f):
            continue
        mp = _unescape(f[4])
        inside = mp == "/" or path == mp or path.startswith(mp + "/")
        if inside and (best is None or len(mp) >= len(best["mount_point"])):
            opts = f[5] + ("," + f[dash + 3] if dash + 3 < len(f) else "")
            best = {"mount_point": mp, "type": f[dash + 1], "source": _unescape(f[dash + 2]),
                    "options": opts}
    return best


def filesystem_of(directory: str) -> dict[str, str]:
    fs = {"path": directory, "mount_point": "", "type": "", "source": "", "options": ""}
    try:
        m = find_mount(Path("/proc/self/mountinfo").read_text(), os.path.realpath(directory))
    except OSError:
        m = None
    if m:
        fs.update(m)
    return fs


def git_commit() -> tuple[str, bool]:
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown", False
        st = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                             "--untracked-files=no"], capture_output=True, text=True, timeout=10)
        return head.stdout.strip(), bool(st.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", False


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The manifest options every producer accepts (same names as tierprobe's)."""
    g = parser.add_argument_group("manifest")
    g.add_argument("--arm", choices=["active", "control", "baseline", "candidate", "other"],
                   default="other")
    g.add_argument("--pair", type=int, default=None, help="pair index")
    g.add_argument("--boot", type=int, default=None, help="boot index")
    g.add_argument("--fault-profile", default="none")
    g.add_argument("--device-layout", default=None, help="free text")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--seed", type=int, default=1)


def build(args: argparse.Namespace, *, producer: str, workload: str, directory: str,
          tool_versions: dict[str, str], start: str, end: str,
          parameters: dict[str, Any], command: list[str] | None = None) -> dict[str, Any]:
    labels: dict[str, str] = {}
    for item in args.label:
        key, eq, value = item.partition("=")
        if not key or not eq:
            raise LabError(f"--label '{item}': want KEY=VALUE")
        labels[key] = value
    commit, dirty = git_commit()
    uname = platform.uname()
    try:
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        mem = 0
    return {
        "producer": producer,
        "workload": workload,
        "tool_versions": tool_versions,
        "git_commit": commit,
        "git_dirty": dirty,
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count() or 0,
                 "memory_bytes": mem},
        "kernel": {"release": uname.release, "version": uname.version,
                   "machine": uname.machine},
        "filesystem": filesystem_of(directory),
        "device_layout": args.device_layout,
        "fault_profile": args.fault_profile,
        "seed": args.seed,
        "start": start,
        "end": end,
        "arm": args.arm,
        "pair": args.pair,
        "boot": args.boot,
        "command": command or [],
        "parameters": parameters,
        "labels": labels,
    }
