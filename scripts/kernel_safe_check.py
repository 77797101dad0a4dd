#!/usr/bin/python3
"""The kernel-safe check: proves the core (fs/) could link into a kernel module.

    kernel_safe_check.py build [--sources fs/sources.list] [--out DIR] [--cxx g++]
        Compiles every core source with the kernel's code-generation flags
        (freestanding, -nostdinc, no exceptions/RTTI, -mcmodel=kernel, no SSE/x87,
        no stack frame over 2048 bytes...),
        checks that every header under fs/ compiles alone with them (except test
        fixtures, `testing.h`, which only *_test.cc files include, as they
        include GoogleTest), and then runs `check` on the objects.
    kernel_safe_check.py check OBJ...
        Inspects ELF objects and fails if any of them
          - needs a symbol that no object in the set defines and that is not in the
            allow-list (the seam's tfs_plat_* functions, memcpy, memset, memmove,
            memcmp, __stack_chk_fail);
          - has a static-constructor or TLS section (.init_array, .ctors, .tbss, ...)
            or exception tables;
          - references C++ runtime machinery: __cxa_*, _Unwind_*, the personality
            routine, or typeinfo (_ZTI*/_ZTS*).

Exit status: 0 clean, 1 violations (one line each on stderr), 2 usage or tool
errors. Run by `make test` through ctest; scripts/kernel_safe_check_test.py proves
that it rejects objects that are not kernel-safe.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The flags a Linux kernel build uses for x86-64 code generation, plus what the
# core needs to be C++ without a runtime.
KERNEL_FLAGS = [
    "-std=gnu++20",
    "-ffreestanding",
    "-nostdinc",
    "-fno-exceptions",
    "-fno-rtti",
    "-fno-threadsafe-statics",
    "-fno-use-cxa-atexit",
    "-mcmodel=kernel",
    "-mno-red-zone",
    "-mno-sse",
    "-mno-mmx",
    "-mno-sse2",
    "-mno-80387",
    "-mno-3dnow",
    "-fno-pic",
    "-fno-asynchronous-unwind-tables",
    "-fno-unwind-tables",
    "-fno-strict-aliasing",
    "-fno-common",
    "-fstack-protector-strong",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    # The kernel's own limit on a function's stack frame (x86-64,
    # CONFIG_FRAME_WARN): big objects go to the heap (platform::Owned).
    "-Wframe-larger-than=2048",
]

ALLOWED_EXACT = {"memcpy", "memset", "memmove", "memcmp", "__stack_chk_fail"}
ALLOWED_PREFIX = ("tfs_plat_",)

FORBIDDEN_SECTIONS = {
    ".init_array": "static constructor",
    ".preinit_array": "static constructor",
    ".ctors": "static constructor",
    ".fini_array": "static destructor",
    ".dtors": "static destructor",
    ".tdata": "thread_local data",
    ".tbss": "thread_local data",
    ".gcc_except_table": "exception tables",
}

FORBIDDEN_SYMBOL = re.compile(r"^(__cxa_|_Unwind_|__gxx_personality|_ZTI|_ZTS)")


@dataclass
class ObjectInfo:
    path: Path
    defined: set[str] = field(default_factory=set)
    undefined: set[str] = field(default_factory=set)
    sections: list[str] = field(default_factory=list)
    tls_symbols: set[str] = field(default_factory=set)


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"kernel-safe check: '{name}' not found (install binutils)")
    return path


def read_object(path: Path) -> ObjectInfo:
    readelf = need_tool("readelf")
    info = ObjectInfo(path)
    syms = subprocess.run([readelf, "-sW", str(path)], capture_output=True, text=True)
    if syms.returncode != 0:
        raise SystemExit(f"kernel-safe check: {path}: not an ELF object: {syms.stderr.strip()}")
    for line in syms.stdout.splitlines():
        # Num: Value Size Type Bind Vis Ndx Name
        parts = line.split()
        if len(parts) < 8 or not parts[0].rstrip(":").isdigit():
            continue
        sym_type, ndx, name = parts[3], parts[6], parts[7]
        if not name or sym_type in ("FILE", "SECTION"):
            continue
        if sym_type == "TLS":
            info.tls_symbols.add(name)
        if ndx == "UND":
            info.undefined.add(name)
        else:
            info.defined.add(name)
    secs = subprocess.run([readelf, "-SW", str(path)], capture_output=True, text=True)
    for m in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+)", secs.stdout, re.M):
        info.sections.append(m.group(1))
    return info


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    if len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines))


def allowed(symbol: str) -> bool:
    return symbol in ALLOWED_EXACT or symbol.startswith(ALLOWED_PREFIX)


def check_objects(paths: list[Path]) -> list[str]:
    """Returns one message per violation (empty: the set is kernel-safe)."""
    objects = [read_object(p) for p in paths]
    defined_anywhere = set().union(*(o.defined for o in objects)) if objects else set()
    problems: list[tuple[Path, str, str]] = []  # (object, symbol or "", message)
    for obj in objects:
        for sec in obj.sections:
            base = sec if sec in FORBIDDEN_SECTIONS else next(
                (s for s in FORBIDDEN_SECTIONS if sec.startswith(s + ".")), None)
            if base is not None:
                problems.append((obj.path, "", f"section {sec} ({FORBIDDEN_SECTIONS[base]})"))
        for sym in sorted(obj.tls_symbols):
            problems.append((obj.path, sym, "thread-local symbol {sym}"))
        for sym in sorted(obj.defined | obj.undefined):
            if FORBIDDEN_SYMBOL.match(sym):
                problems.append((obj.path, sym, "C++ runtime symbol {sym}"))
        for sym in sorted(obj.undefined - defined_anywhere):
            if not allowed(sym) and not FORBIDDEN_SYMBOL.match(sym):
                problems.append((obj.path, sym, "undefined symbol {sym} is outside the seam"))
    names = demangle(sorted({s for _, s, _ in problems if s}))
    out = []
    for path, sym, msg in problems:
        if sym:
            pretty = names.get(sym, sym)
            shown = sym if pretty == sym else f"{pretty} ({sym})"
            msg = msg.format(sym=shown)
        out.append(f"{path.name}: {msg}")
    return out


def read_source_list(list_path: Path) -> list[Path]:
    root = list_path.parent
    sources = []
    for raw in list_path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        src = root / line
        if not src.is_file():
            raise SystemExit(f"kernel-safe check: {list_path}: listed source {line} does not exist")
        sources.append(src)
    if not sources:
        raise SystemExit(f"kernel-safe check: {list_path}: no sources listed")
    return sources


def compile_sources(sources: list[Path], include_root: Path, out_dir: Path, cxx: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    objects = []
    failed = False
    for src in sources:
        rel = src.relative_to(include_root)
        obj = out_dir / (str(rel).replace(os.sep, "_") + ".o")
        cmd = [cxx, *KERNEL_FLAGS, f"-I{include_root}", "-c", str(src), "-o", str(obj)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            failed = True
            print(f"kernel-safe check: {rel}: does not compile with kernel flags:", file=sys.stderr)
            print(res.stderr.rstrip(), file=sys.stderr)
        objects.append(obj)
    # Every header must stand alone under the same flags (no hidden system include).
    for header in sorted(include_root.rglob("*.h")):
        rel = header.relative_to(include_root)
        if header.name == "testing.h":  # a test fixture: tests only, never in the module
            continue
        cmd = [cxx, *KERNEL_FLAGS, f"-I{include_root}", "-x", "c++", "-fsyntax-only", str(header)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            failed = True
            print(f"kernel-safe check: {rel}: header does not compile alone with kernel flags:",
                  file=sys.stderr)
            print(res.stderr.rstrip(), file=sys.stderr)
    if failed:
        raise SystemExit(1)
    return objects


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the core with kernel flags, then check it")
    default_list = Path(__file__).resolve().parent.parent / "fs" / "sources.list"
    b.add_argument("--sources", type=Path, default=default_list, help="source list (fs/sources.list)")
    b.add_argument("--out", type=Path, default=Path("build/kernel-safe"), help="object directory")
    b.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="C++ compiler")
    c = sub.add_parser("check", help="check ELF objects")
    c.add_argument("objects", nargs="+", type=Path)
    args = parser.parse_args(argv)

    if args.cmd == "build":
        sources = read_source_list(args.sources)
        objects = compile_sources(sources, args.sources.parent, args.out, args.cxx)
    else:
        objects = args.objects
        for o in objects:
            if not o.is_file():
                print(f"kernel-safe check: {o}: no such file", file=sys.stderr)
                return 2
    problems = check_objects(objects)
    for p in problems:
        print(f"kernel-safe check: {p}", file=sys.stderr)
    if problems:
        print(f"kernel-safe check: FAILED: {len(problems)} problem(s) in {len(objects)} object(s)",
              file=sys.stderr)
        return 1
    print(f"kernel-safe check: ok: {len(objects)} object(s), only seam symbols referenced")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
