"""The FUSE front end only translates (docs/design/core.md): every filesystem
decision is posix's, so the kernel glue can call the same thing.

Checked on the source of userspace/fuse/fuse_ops.cc:
- it includes nothing of the core below posix (no engine/, journal/, btree/,
  alloc/, data/, dev/ header) and reaches for no engine or journal;
- it tests no file type (S_IS*: posix answers kNotDir, kIsDir, ...);
- each operation calls posix once -- except the ioctl dispatcher (one call
  per command) and create, which gives its handle back when the kernel did
  not take the reply (an interrupted open).
"""
from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).with_name("fuse_ops.cc")

CORE_BELOW_POSIX = ("engine/", "journal/", "btree/", "alloc/", "data/", "dev/", "sb/")
# Operations allowed more than one posix call, and the calls allowed beyond one.
DISPATCH = {"Ioctl"}
EXTRA = {"Create": {"Release"}}
# `tierfs ctl`'s counters are still gathered from the engine by ctl.cc until
# the counters live in the core (docs/design/core.md, step 3): the one place
# allowed to name the engine, and the test fails once it is gone so that this
# allowance goes with it.
CTL_UNTIL_STEP3 = "StatsJson(*c->engine, *c->fs, c->members)"


def operations(text: str) -> dict[str, str]:
    """The bodies of the functions MakeOps() installs, by name."""
    ops = dict(re.findall(r"^\s*o\.(\w+) = (\w+);", text, re.M))
    out: dict[str, str] = {}
    for fn in ops.values():
        m = re.search(rf"^void {fn}\([^)]*\)\s*{{", text, re.M)
        assert m, f"no definition of {fn}"
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out[fn] = text[m.end():i - 1]
    return out


def posix_calls(body: str) -> list[str]:
    return re.findall(r"->fs->(\w+)\(", body)


def check(text: str) -> list[str]:
    problems = []
    text = text.replace(CTL_UNTIL_STEP3, "StatsJson(...)")
    for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
        if inc.startswith(CORE_BELOW_POSIX):
            problems.append(f"includes {inc}")
    for what in ("->engine", "journal()", "btree::", "alloc::"):
        if what in text:
            problems.append(f"reaches below posix: {what}")
    if re.search(r"\bS_IS[A-Z]+\(", text):
        problems.append("tests a file type (S_IS*)")
    for fn, body in operations(text).items():
        calls = posix_calls(body)
        if fn in DISPATCH:
            continue
        extra = [c for c in calls[1:] if c not in EXTRA.get(fn, set())]
        if extra:
            problems.append(f"{fn} calls posix more than once: {', '.join(calls)}")
    return problems


def test_fuse_ops_only_translates() -> None:
    text = SRC.read_text()
    ops = operations(text)
    assert len(ops) >= 30 and "Open" in ops and "ReadDirPlus" in ops
    assert CTL_UNTIL_STEP3 in text, "ctl's counters moved: drop CTL_UNTIL_STEP3"
    assert check(text) == []


def test_the_check_finds_logic_in_the_glue() -> None:
    # The forms of decision-making the front end had before issue 20 step 1.
    before = SRC.read_text()
    bad = before.replace(
        "void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {",
        "void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {\n"
        "  auto a = Ctx(req)->fs->GetAttr(ino);\n"
        "  if (!S_ISDIR(a.value().mode)) return (void)fuse_reply_err(req, ENOTDIR);\n")
    bad = bad.replace('#include "userspace/fuse/ctl.h"',
                      '#include "userspace/fuse/ctl.h"\n#include "journal/journal.h"')
    bad += "\nvoid X() { Ctx(req)->engine->journal().Flush(); }\n"
    problems = check(bad)
    assert "includes journal/journal.h" in problems
    assert "tests a file type (S_IS*)" in problems
    assert "reaches below posix: ->engine" in problems
    assert "OpenDir calls posix more than once: GetAttr, OpenDir" in problems
