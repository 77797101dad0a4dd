"""`make labtest`: a real, short A/A `tierlab pair` (2 pairs of the labtest
profile: fixed 8 ms HDD, 2 s + 10 s phases, a 2 s stall) on this machine.

It asserts only what noise cannot break: the run completes, every document
validates, fsck is clean after every run, the report and the gate are produced
and the edge-inventory table exists. Whether the gate passes is printed, not
asserted (a shared 2-core machine moves p99 by tens of percent between pairs).
Not collected by plain pytest (no _test suffix): `make labtest` runs it, and
`make test` runs `make labtest` last."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tierlab import schema
from tierlab.testing import run, tool


# as userspace/fuse/fusetest.py's needs_fuse: a real mount needs /dev/fuse,
# fusermount3 and root
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None
    or os.geteuid() != 0, reason="needs /dev/fuse, fusermount3 and root")


@needs_fuse
def test_short_aa_pair_run(tmp_path: Path) -> None:
    out = tmp_path / "lab"
    t0 = time.monotonic()
    proc = run([tool("tierlab"), "pair", "--profile", "labtest", "--pairs", "2", "--out", out],
               timeout=300)
    wall = time.monotonic() - t0
    sys.stderr.write(proc.stdout[-3000:])
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr
    meta = json.loads((out / "lab.json").read_text())
    assert meta["pairs"] == 2 and len(meta["runs"]) == 4
    slots = {}
    for rel in meta["runs"]:
        r = out / rel
        info = json.loads((r / "run.json").read_text())
        assert info["status"] == "ok", (rel, info["error"])
        assert info["fsck"]["clean"], (rel, (r / "fsck.txt").read_text()[-500:])
        doc = schema.load(r / "probe.json")
        assert doc["manifest"]["slot"] == info["slot"]
        slots.setdefault(info["arm"], set()).add(info["slot"])
        schema.load(r / "bg.json")
        for edge in ("start", "measure", "end", "idle"):
            assert (r / f"ctl-{edge}.json").is_file()
        assert (r / "fault-hdd.b.json").is_file()
        assert [e["command"] for e in info["events"]] == ["stall 2s"]
        assert all(e["rc"] == 0 for e in info["events"]), (rel, info["events"])
        assert info["quiescence_s"] is not None, (rel, info["quiesce"][-3:])
    assert slots == {"active": {0, 1}, "control": {0, 1}}  # the arms swapped slots
    rep = out / "report"
    md = (rep / "report.md").read_text()
    assert "## Edge inventory" in md and "| arm | run | member | origin | op | ops | bytes |" in md
    assert "## Around each fault event" in md
    assert (rep / "report.html").is_file() and (rep / "summary.json").is_file()
    g = run([tool("tierlab"), "gate", out])
    assert g.returncode in (0, 1), g.stderr
    for name in ("p99 ratio", "throughput ratio", "edge inventory", "fsck clean", "rate kept"):
        assert name in g.stdout
    sys.stderr.write(f"\nlabtest: tierlab pair wall time {wall:.0f} s\n{g.stdout}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
