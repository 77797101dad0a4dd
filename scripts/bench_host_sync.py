#!/usr/bin/python3
"""What the durable-write primitives cost on the disk under a directory: the floor
a filesystem's fsync stands on (docs/benchmarks.md, "What changed the fsync path").

    scripts/bench-host-sync [--dir /var/tmp] [--n 3000] [--size 64M] [--json PATH]

On a file written through once (no holes: no allocation during the timing), each
pattern runs --n times at random 4 KiB offsets; the median and p99 of its
latency are printed (microseconds):

  odirect_write          one 4 KiB O_DIRECT pwrite
  fdatasync              fdatasync with nothing new to write (the device's flush)
  dsync_write            one 4 KiB O_DIRECT pwritev with RWF_DSYNC (FUA, or write + flush)
  buffered_write_fsync   a 4 KiB buffered pwrite, then fsync (passthrough_ll's fsync of a write)
  ordered_commit         O_DIRECT write, fdatasync, RWF_DSYNC write (data, pre-flush, FUA entry)
  unordered_commit       two O_DIRECT writes, then fdatasync (data, entry, one flush)

Python's own call overhead is in every number (a few microseconds a call); compare
patterns within one run. Any failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from bench_fs import parse_size  # scripts/ is this script's directory

BLOCK = 4096


class BenchError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"bench-host-sync: {message}", file=sys.stderr)
        sys.exit(1)


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def measure(n: int, step: Callable[[], None]) -> dict[str, float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter_ns()
        step()
        lat.append((time.perf_counter_ns() - t) / 1000)
    return {"p50_us": round(statistics.median(lat), 1), "p99_us": round(percentile(lat, 99), 1)}


def run(directory: Path, n: int, size: int) -> dict[str, dict[str, float]]:
    if size < 16 * BLOCK:
        raise BenchError(f"--size {size} is too small (at least 64 KiB)")
    path = directory / f"bench-host-sync.{os.getpid()}"
    try:
        buffered = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise BenchError(f"{directory}: cannot create a scratch file: {e.strerror}") from None
    direct = -1
    try:
        chunk = b"\1" * (1 << 20)
        for off in range(0, size, len(chunk)):
            os.pwrite(buffered, chunk[: min(len(chunk), size - off)], off)
        os.fsync(buffered)
        try:
            direct = os.open(path, os.O_RDWR | os.O_DIRECT)
        except OSError as e:
            raise BenchError(f"{directory}: O_DIRECT is not supported here: {e.strerror}") from None
        buf = mmap.mmap(-1, BLOCK)  # page aligned, as O_DIRECT wants
        buf.write(b"\2" * BLOCK)
        rng = random.Random(1)
        blocks = size // BLOCK

        def off() -> int:
            return rng.randrange(blocks) * BLOCK

        def dwrite(flags: int = 0) -> None:
            if os.pwritev(direct, [buf], off(), flags) != BLOCK:
                raise BenchError("short O_DIRECT write")

        def bwrite_fsync() -> None:
            os.pwrite(buffered, bytes(buf), off())
            os.fsync(buffered)

        def ordered() -> None:
            dwrite()
            os.fdatasync(direct)
            dwrite(os.RWF_DSYNC)

        def unordered() -> None:
            dwrite()
            dwrite()
            os.fdatasync(direct)

        patterns: dict[str, Callable[[], None]] = {
            "odirect_write": dwrite,
            "fdatasync": lambda: os.fdatasync(direct),
            "dsync_write": lambda: dwrite(os.RWF_DSYNC),
            "buffered_write_fsync": bwrite_fsync,
            "ordered_commit": ordered,
            "unordered_commit": unordered,
        }
        return {name: measure(n, step) for name, step in patterns.items()}
    except OSError as e:
        raise BenchError(f"{path}: {e.strerror}") from None
    finally:
        if direct >= 0:
            os.close(direct)
        os.close(buffered)
        path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    ap = Parser(prog="bench-host-sync", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the scratch file goes (default /var/tmp)")
    ap.add_argument("--n", type=int, default=3000, help="repetitions of each pattern (default 3000)")
    ap.add_argument("--size", type=parse_size, default=parse_size("64M"), help="the scratch file (default 64M)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        if args.n < 1:
            raise BenchError(f"--n must be at least 1, not {args.n}")
        if not args.dir.is_dir():
            raise BenchError(f"{args.dir}: not a directory")
        results = run(args.dir, args.n, args.size)
    except BenchError as e:
        print(f"bench-host-sync: {e}", file=sys.stderr)
        return 1
    print(f"{'pattern':<22} {'p50 µs':>8} {'p99 µs':>8}   ({args.n} each, {args.dir})")
    for name, r in results.items():
        print(f"{name:<22} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f}")
    if args.json is not None:
        doc = {"benchmark": "bench-host-sync", "dir": str(args.dir), "n": args.n, "size": args.size,
               "started": started, "results": results}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
