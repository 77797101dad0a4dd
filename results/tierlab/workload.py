"""Shared plumbing for the workload folders' run scripts and parsers
(workloads/<name>/run, parse.py): the common command line (target directory,
output file, manifest options), building a validated results document from
histograms, per-second series from timed samples, and the one-line-error wrapper.

A workload folder keeps what is specific to it -- what it runs and how it reads
its raw output -- and calls this for the rest, so every producer writes the same
format and gets validated the same way."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tierlab import LabError, manifest, schema
from tierlab.cli import LabArgumentParser
from tierlab.hist import Histogram


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = LabArgumentParser(prog=prog, description=description)
    manifest.add_run_options(p)
    return p


def target_dir(path: str) -> str:
    """The workload's target directory, which must exist."""
    if not os.path.isdir(path):
        raise LabError(f"--dir {path}: " + ("not a directory" if os.path.exists(path)
                                             else "no such directory"))
    return path


def series(samples: Sequence[tuple[float, int]], seconds: float) -> dict[str, Any]:
    """Per-second points from (seconds since start, latency ns) samples, placed in
    the second the operation started; seconds without operations have count 0."""
    per: dict[int, Histogram] = {}
    for t, ns in samples:
        per.setdefault(int(t), Histogram()).record(ns)
    points = []
    for s in range(max(1, math.ceil(seconds))):
        h = per.get(s, Histogram())
        points.append({"t": s, "phase": "measure", "count": h.count,
                       "p50_ns": h.quantile("0.5"), "p99_ns": h.quantile("0.99"),
                       "p999_ns": h.quantile("0.999"), "max_ns": h.max})
    return {"interval_s": 1, "of": "latency", "points": points}


def document(man: dict[str, Any], ops: dict[str, Histogram], *, seconds: float,
             counters: dict[str, float], throughput_ops: int | None = None,
             bytes_per_s: float | None = None, timeseries: dict[str, Any] | None = None,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A results document. `ops` maps op name -> latency histogram; the "all" entry
    is added. Throughput counts `throughput_ops` (default: every op) over `seconds`."""
    if not ops or all(h.count == 0 for h in ops.values()):
        raise LabError("the workload completed no operation; nothing to report")
    all_ops = Histogram.merged(ops.values())
    n = all_ops.count if throughput_ops is None else throughput_ops
    tp: dict[str, Any] = {"ops": n, "seconds": seconds,
                          "ops_per_s": n / seconds if seconds > 0 else 0.0}
    if bytes_per_s is not None:
        tp["bytes_per_s"] = bytes_per_s
    meas: dict[str, Any] = {
        "ops": {name: {"latency": h.to_json()} for name, h in {**ops, "all": all_ops}.items()},
        "phases": [{"name": "measure", "start_s": 0, "end_s": seconds, "measured": True}],
        "throughput": tp,
        "counters": counters,
    }
    if timeseries is not None:
        meas["timeseries"] = timeseries
    if extra:
        meas.update(extra)
    return {"format": schema.FORMAT, "version": schema.VERSION, "manifest": man,
            "measurements": meas}


def main(prog: str, body: Callable[[], int]) -> None:
    """Runs a workload script's body; LabError and OSError become one line, exit 2."""
    try:
        code = body()
    except LabError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = 2
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"{prog}:{where}: {e.strerror or e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def write(doc: dict[str, Any], out: str) -> None:
    schema.write(doc, Path(out))


class Recorder:
    """Times a Python workload's operations and keeps every sample as
    (seconds since start, ns); raw() is the folder's raw output, which the folder's
    parse.py turns into a results document with parse_raw()."""

    def __init__(self) -> None:
        self.t0 = time.monotonic_ns()
        self.start = manifest.iso_now()
        self.samples: dict[str, list[list[float]]] = {}

    def add(self, op: str, began_ns: int, ns: int) -> None:
        self.samples.setdefault(op, []).append([(began_ns - self.t0) / 1e9, ns])

    def time(self, op: str, fn: Callable[[], Any]) -> Any:
        began = time.monotonic_ns()
        result = fn()
        self.add(op, began, time.monotonic_ns() - began)
        return result

    def elapsed(self) -> float:
        return (time.monotonic_ns() - self.t0) / 1e9

    def raw(self, workload: str, directory: str, parameters: dict[str, Any],
            counters: dict[str, float], throughput_ops: int | None = None) -> dict[str, Any]:
        return {"workload": workload, "directory": directory, "start": self.start,
                "end": manifest.iso_now(), "seconds": self.elapsed(),
                "parameters": parameters, "counters": counters,
                "throughput_ops": throughput_ops, "samples": self.samples}


def parse_raw(raw: dict[str, Any], args: argparse.Namespace, producer: str) -> dict[str, Any]:
    """Raw output of a Recorder-based workload -> results document."""
    try:
        samples = raw["samples"]
        ops = {op: Histogram.from_samples(ns for _t, ns in pts) for op, pts in samples.items()}
        every = [(float(t), int(ns)) for pts in samples.values() for t, ns in pts]
        seconds = float(raw["seconds"])
        man = manifest.build(args, producer=producer, workload=raw["workload"],
                             directory=raw["directory"], tool_versions={producer: "1"},
                             start=raw["start"], end=raw["end"], parameters=raw["parameters"])
        counters = {k: float(v) for k, v in raw["counters"].items()}
        tp_ops = raw.get("throughput_ops")
    except (KeyError, TypeError, ValueError) as e:
        raise LabError(f"raw workload output is malformed ({type(e).__name__}: {e})") from None
    return document(man, ops, seconds=seconds, counters=counters, throughput_ops=tp_ops,
                    timeseries=series(every, seconds))


def run_and_parse(prog: str, folder: Path, args: argparse.Namespace, raw: dict[str, Any]) -> None:
    """End of a run script: keep the raw output beside --out, then parse it with the
    folder's parser (parse.py), exactly as a later re-parse would."""
    raw_path = Path(args.out + ".raw.json")
    raw_path.write_text(json.dumps(raw) + "\n")
    cmd = [sys.executable, str(folder / "parse.py"), str(raw_path), "--out", args.out,
           "--arm", args.arm, "--fault-profile", args.fault_profile, "--seed", str(args.seed)]
    for flag in ("pair", "boot", "device_layout"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for label in args.label:
        cmd += ["--label", label]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                       else f"{folder.name}/parse.py failed")


def parse_main(prog: str, producer: str) -> None:
    """The whole parse.py of a Recorder-based workload folder."""
    p = parser(prog, f"Turn {producer}'s raw output (RAW.raw.json) into a results document.")
    p.add_argument("raw", help="raw output written by the run script")
    p.add_argument("--out", required=True)

    def body() -> int:
        args = p.parse_args()
        try:
            raw = json.loads(Path(args.raw).read_text())
        except json.JSONDecodeError as e:
            raise LabError(f"{args.raw}: not JSON: {e.msg} at line {e.lineno}") from None
        except UnicodeDecodeError as e:
            raise LabError(f"{args.raw}: not JSON: byte {e.start} is not UTF-8") from None
        except RecursionError:
            raise LabError(f"{args.raw}: not JSON of a workload: nested too deeply") from None
        write(parse_raw(raw, args, producer), args.out)
        return 0

    main(prog, body)


WRITER_CODE = r"""
import os, signal, sys
d, chunk, limit, fsync_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
written, stop = 0, False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
buf = os.urandom(chunk)
files, i = max(1, limit // (64 << 20)), 0
while not stop:
    path = os.path.join(d, f"w{i % files}")
    with open(path, "wb") as f:
        for k in range(min(64 << 20, limit) // chunk):
            if stop:
                break
            f.write(buf)
            written += chunk
            if fsync_every and (k + 1) % fsync_every == 0:
                os.fsync(f.fileno())
    i += 1
print(written, flush=True)
"""


class BackgroundWriter:
    """A child process that keeps writing files under `directory` (1 MiB chunks,
    overwriting a set of at most `limit` bytes) until stop(): the "something else
    writes" of metadata-storm and syncfs. A separate process, so it does not share
    the measuring interpreter's lock."""

    def __init__(self, directory: Path, limit: int, fsync_every: int = 0,
                 chunk: int = 1 << 20) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER_CODE, str(directory), str(chunk), str(limit),
             str(fsync_every)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self) -> int:
        """Stops the writer; returns the bytes it wrote. A writer that died early
        (no space, ...) is an error: the load the workload promised was not there."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit {self.proc.returncode}"
            raise LabError(f"background writer failed: {last}")
        return int(out.strip() or 0)
