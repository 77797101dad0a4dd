"""The FUSE front end only translates (docs/design/core.md): every filesystem
decision is posix's, so the kernel glue can call the same thing.

Checked on the source of userspace/fuse/fuse_ops.cc (comments and string
literals removed first):
- it includes nothing of the core below posix (no store/, journal/, btree/,
  alloc/, data/, dev/, sb/ header) and reaches for no store or journal;
- it tests no file type (S_IS*: posix answers kNotDir, kIsDir, ...);
- it does not keep the posix pointer in a variable of its own (every call
  reads `...->fs->Op(`, so every call is seen);
- each operation calls posix once, counting the calls of the helpers it
  calls -- except the ioctl dispatcher (once per command branch), and create,
  open and opendir, which give their handle back when the kernel did not take
  the reply (an interrupted open).

Reading the request's credentials is translation too, not a decision: the
caller's uid, gid (Who) and, for posix's question on an O_DIRECT write of a
file with setid bits, whether the writer has CAP_FSETID (WriterHasFsetid
reads it from /proc/<pid>/status, since fuse_ctx carries no capabilities),
and for a set or remove of a tierfs.* option by another than the file's
owner whether the caller has CAP_FOWNER (the same way; posix decides).
posix decides what a write takes away; the glue only answers and, when posix
says it took something, drops the kernel's cached attributes.
"""
from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).with_name("fuse_ops.cc")

CORE_BELOW_POSIX = ("store/", "journal/", "btree/", "alloc/", "data/", "dev/", "sb/")
# The one operation that dispatches (once per `if (cmd == ...)` branch), and
# those that give a handle back when the kernel did not take the reply.
DISPATCH = "Ioctl"
SEQUENCES = {"Create": (["CreateOpen"], ["CreateOpen", "Release"]),
             "Open": (["Open"], ["Open", "Release"]),
             "OpenDir": (["OpenDir"], ["OpenDir", "ReleaseDir"])}
# `tierfs ctl`'s counters are the core's document (fs/mount/stats.h): the
# glue hands the instance to ctl whole and reaches nothing through it.


def strip(text: str) -> str:
    """Comments and string and character literals blanked (a brace or a call
    inside one is not code)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(code: str) -> dict[str, str]:
    """Every function defined at the top of a line, name -> body."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^[A-Za-z_][\w:<>*&, ]*?\b(\w+)\(([^;{}]*)\)\s*(?:const\s*)?{", code, re.M):
        depth, i = 1, m.end()
        while depth:
            if i >= len(code):
                raise AssertionError(f"unbalanced braces in {m.group(1)}")
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        out[m.group(1)] = code[m.end():i - 1]
    return out


def operations(code: str) -> dict[str, str]:
    """The bodies of the functions MakeOps() installs, by name."""
    defined = functions(code)
    ops = dict(re.findall(r"^\s*o\.(\w+) = (\w+);", code, re.M))
    for fn in ops.values():
        assert fn in defined, f"no definition of {fn}"
    return {fn: defined[fn] for fn in ops.values()}


def posix_calls(body: str, defined: dict[str, str], seen: frozenset[str] = frozenset()) -> list[str]:
    """posix calls in `body`, and in the file's own functions it calls, in order."""
    calls: list[tuple[int, str]] = [(m.start(), m.group(1)) for m in re.finditer(r"->fs->(\w+)\(", body)]
    for m in re.finditer(r"(?<!->)(?<!\.)\b(\w+)\(", body):  # a free function's call, not a member's
        name = m.group(1)
        if name in defined and name not in seen:
            calls += [(m.start(), c) for c in posix_calls(defined[name], defined, seen | {name})]
    return [c for _, c in sorted(calls)]


def check(text: str) -> list[str]:
    problems = []
    for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
        if inc.startswith(CORE_BELOW_POSIX):
            problems.append(f"includes {inc}")
    code = strip(text)
    for what in ("->store", "store::", "store()", "journal()", "btree::", "alloc::", "instance->"):
        if what in code:
            problems.append(f"reaches below posix: {what}")
    if re.search(r"\bS_IS[A-Z]+\(", code):
        problems.append("tests a file type (S_IS*)")
    if re.search(r"->fs\b(?!->)", code):
        problems.append("keeps the posix pointer in a variable (its calls would not be seen)")
    defined = functions(code)
    for fn, body in operations(code).items():
        if fn == DISPATCH:
            branches = re.split(r"\bif \(cmd ==", body)
            for b in branches:
                calls = posix_calls(b, defined)
                if len(calls) > 1:
                    problems.append(f"{fn}: a command branch calls posix more than once: {', '.join(calls)}")
            continue
        calls = posix_calls(body, defined)
        if fn in SEQUENCES:
            if calls not in SEQUENCES[fn]:
                problems.append(f"{fn} calls posix as {', '.join(calls)}")
        elif len(calls) > 1:
            problems.append(f"{fn} calls posix more than once: {', '.join(calls)}")
    return problems


def test_fuse_ops_only_translates() -> None:
    text = SRC.read_text()
    ops = operations(strip(text))
    assert len(ops) >= 30 and "Open" in ops and "ReadDirPlus" in ops
    assert check(text) == []


def test_the_check_finds_logic_in_the_glue() -> None:
    # The forms of decision-making the front end had before issue 20 step 1,
    # and ways of hiding them from a naive reading.
    src = SRC.read_text()
    head = "void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {"
    assert head in src

    def with_opendir(extra: str) -> list[str]:
        return check(src.replace(head, head + "\n" + extra))

    p = with_opendir("  auto a = Ctx(req)->fs->GetAttr(ino);\n"
                     "  if (!S_ISDIR(a.value().mode)) return (void)fuse_reply_err(req, ENOTDIR);\n")
    assert "tests a file type (S_IS*)" in p
    assert "OpenDir calls posix as GetAttr, OpenDir, ReleaseDir" in p
    # A brace in a string or a comment does not end the body early.
    p = with_opendir('  const char* s = "}"; // {\n  (void)Ctx(req)->fs->GetAttr(ino); (void)s;\n')
    assert "OpenDir calls posix as GetAttr, OpenDir, ReleaseDir" in p, p
    # A helper's calls count as the operation's.
    helper = "void Probe(fuse_req_t req, fuse_ino_t ino) { (void)Ctx(req)->fs->GetAttr(ino); }\n\n"
    p = check(src.replace(head, helper + head + "\n  Probe(req, ino);\n"))
    assert "OpenDir calls posix as GetAttr, OpenDir, ReleaseDir" in p, p
    p = check(src.replace("void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {",
                          helper + "void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {\n"
                          "  Probe(req, parent);"))
    assert "Rmdir calls posix more than once: GetAttr, Rmdir" in p, p
    # An alias of the posix pointer.
    p = with_opendir("  auto* fs = Ctx(req)->fs;\n  (void)fs;\n")
    assert "keeps the posix pointer in a variable (its calls would not be seen)" in p
    p = check(src.replace('#include "userspace/fuse/ctl.h"',
                          '#include "userspace/fuse/ctl.h"\n#include "journal/journal.h"')
              + "\nvoid X(fuse_req_t req) { Ctx(req)->store->journal().Flush(); }\n")
    assert "includes journal/journal.h" in p and "reaches below posix: ->store" in p
    p = check(src + "\nvoid Y(fuse_req_t req) { Ctx(req)->instance->store().journal().Flush(); }\n")
    assert "reaches below posix: instance->" in p and "reaches below posix: store()" in p, p
    # Create must be CreateOpen (and its give-back), not create-then-open.
    p = check(src.replace("c->fs->CreateOpen(parent, name, Len(name), uint32_t(mode), Who(req))",
                          "c->fs->Mknod(parent, name, Len(name), uint32_t(mode), 0, Who(req))"))
    assert "Create calls posix as Mknod, Release" in p, p
    # Each ioctl command calls posix once.
    p = check(src.replace("Status st = Ctx(req)->fs->SetFlags(ino, uint32_t(v));",
                          "(void)Ctx(req)->fs->GetAttr(ino);\n    Status st = Ctx(req)->fs->SetFlags(ino, uint32_t(v));"))
    assert "Ioctl: a command branch calls posix more than once: GetAttr, SetFlags" in p, p
