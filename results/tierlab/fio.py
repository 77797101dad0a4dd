"""fio as a lab producer: run a workload folder's job file and turn fio's
`--output-format=json+` output into a results document.

json+ carries fio's latency histogram ("bins": representative value in ns -> count)
for completion latency (clat) per direction and for fsync/fdatasync (sync lat).
Each bin is re-bucketed into tfs::Histogram buckets (fio's own bins are ~1.6% wide,
so the combined error stays within a few percent) and the exact min/max are kept,
so fio runs merge and compare with every other producer. All jobs of a run are
merged. Per-direction summaries (iops, bandwidth, fio's own percentiles) go to
measurements.fio as parsed data."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tierlab import LabError, manifest
from tierlab import workload as wl
from tierlab.hist import Histogram

DIRECTIONS = ("read", "write", "trim")


def fio_version() -> str:
    exe = shutil.which("fio")
    if exe is None:
        raise LabError("fio is not installed (Debian package 'fio': scripts/install-deps lab)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _bins_histogram(lat: dict[str, Any]) -> Histogram:
    h = Histogram()
    for value, n in lat.get("bins", {}).items():
        h.record(int(float(value)), int(n))
    if h.count:
        h.min, h.max = int(lat["min"]), int(lat["max"])
    return h


def _summary(d: dict[str, Any], lat_key: str) -> dict[str, Any]:
    lat = d.get(lat_key, {})
    return {
        "ios": d.get("total_ios", 0), "iops": d.get("iops", 0.0),
        "bw_bytes": d.get("bw_bytes", 0), "io_bytes": d.get("io_bytes", 0),
        "runtime_ms": d.get("runtime", 0),
        "lat_ns": {k: lat.get(k) for k in ("min", "max", "mean", "stddev") if k in lat},
        "percentiles_ns": lat.get("percentile", {}),
    }


# What malformed fio JSON raises on the way in (a string where a number belongs, a
# missing key, a list where an object belongs); parse() turns them into LabError.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


def parse(fio_doc: dict[str, Any], op_names: dict[str, str]) -> dict[str, Any]:
    """Parsed pieces of one fio json+ document: `ops` (name -> Histogram), seconds,
    counters and the fio summary. `op_names` maps fio's "read"/"write"/"trim"/"sync"
    to the op names this workload reports (unmapped sections are left out).
    Malformed input raises LabError."""
    if not isinstance(fio_doc, dict):
        raise LabError(f"fio output is a JSON {type(fio_doc).__name__}, not an object "
                       "(was it run with --output-format=json+?)")
    try:
        return _parse(fio_doc, op_names)
    except MALFORMED as e:
        raise LabError(f"fio output is malformed ({type(e).__name__}: {e})"[:300]) from None


def _parse(fio_doc: dict[str, Any], op_names: dict[str, str]) -> dict[str, Any]:
    jobs = fio_doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise LabError("fio output has no jobs (was it run with --output-format=json+?)")
    ops: dict[str, Histogram] = {}
    counters: dict[str, float] = {"fio_jobs": len(jobs), "fio_errors": 0}
    summary_jobs = []
    seconds = 0.0
    total_ios, total_bytes_per_s = 0, 0.0
    for job in jobs:
        counters["fio_errors"] += 1 if job.get("error", 0) else 0
        seconds = max(seconds, job.get("job_runtime", 0) / 1000.0)
        js: dict[str, Any] = {"name": job.get("jobname", ""), "error": job.get("error", 0)}
        for d in DIRECTIONS:
            sec = job.get(d)
            if not sec or not sec.get("total_ios"):
                continue
            if "bins" not in sec.get("clat_ns", {}):
                raise LabError("fio output has no latency bins: run fio with --output-format=json+")
            js[d] = _summary(sec, "clat_ns")
            total_ios += sec["total_ios"]
            total_bytes_per_s += sec.get("bw_bytes", 0)
            for key in ("iops", "bw_bytes"):
                counters[f"{d}_{key}"] = counters.get(f"{d}_{key}", 0) + sec.get(key, 0)
            if d in op_names:
                ops.setdefault(op_names[d], Histogram()).merge(_bins_histogram(sec["clat_ns"]))
        sync = job.get("sync", {})
        if sync.get("total_ios"):
            js["sync"] = {"ios": sync["total_ios"],
                          "lat_ns": {k: sync["lat_ns"].get(k) for k in ("min", "max", "mean")}}
            counters["sync_ios"] = counters.get("sync_ios", 0) + sync["total_ios"]
            if "sync" in op_names:
                ops.setdefault(op_names["sync"], Histogram()).merge(_bins_histogram(sync["lat_ns"]))
        for key in ("usr_cpu", "sys_cpu"):
            counters[key] = counters.get(key, 0) + float(job.get(key, 0))
        summary_jobs.append(js)
    return {"ops": ops, "seconds": seconds, "counters": counters, "ios": total_ios,
            "bytes_per_s": total_bytes_per_s,
            "fio": {"version": fio_doc.get("fio version", ""), "jobs": summary_jobs}}


def to_document(fio_doc: dict[str, Any], args: argparse.Namespace, *, workload: str,
                directory: str, op_names: dict[str, str], start: str, end: str,
                parameters: dict[str, Any]) -> dict[str, Any]:
    p = parse(fio_doc, op_names)
    man = manifest.build(args, producer="fio", workload=workload, directory=directory,
                         tool_versions={"fio": fio_doc.get("fio version", "unknown")},
                         start=start, end=end, parameters=parameters)
    return wl.document(man, p["ops"], seconds=p["seconds"], counters=p["counters"],
                       throughput_ops=p["ios"], bytes_per_s=p["bytes_per_s"],
                       extra={"fio": p["fio"]})


def load_output(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise LabError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise LabError(f"{path}: not fio JSON output: byte {e.start} is not UTF-8") from None
    # fio may print notices before the JSON (e.g. "fio: file hash not empty").
    start = text.find("{")
    try:
        return json.loads(text[start:] if start >= 0 else text)
    except json.JSONDecodeError as e:
        raise LabError(f"{path}: not fio JSON output: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise LabError(f"{path}: not fio JSON output: nested too deeply") from None


def run_job(job_file: Path, env: dict[str, str], raw_out: Path) -> tuple[str, str]:
    """Runs fio on `job_file` with `env` (the job's ${VARS}); returns (start, end)."""
    fio_version()
    start = manifest.iso_now()
    proc = subprocess.run(["fio", "--output-format=json+", f"--output={raw_out}", str(job_file)],
                          env={**os.environ, **env}, capture_output=True, text=True)
    end = manifest.iso_now()
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise LabError("fio failed: " + (lines[-1] if lines else f"exit {proc.returncode}"))
    return start, end


def main(*, prog: str, folder: Path, job: str, op_names: dict[str, str],
         description: str, defaults: dict[str, str]) -> None:
    """The whole `run` script of a fio workload folder: options -> fio -> document.
    `defaults` holds the job file's variables (SIZE, RUNTIME, ...) as options."""
    p = wl.parser(prog, description)
    p.add_argument("--dir", required=True, help="directory on the filesystem under test")
    p.add_argument("--out", required=True, help="results JSON to write")
    p.add_argument("--raw", help="keep fio's own JSON here (default: OUT.fio.json)")
    p.add_argument("--keep", action="store_true", help="keep fio's data files afterwards")
    for var, value in defaults.items():
        p.add_argument(f"--{var.lower().replace('_', '-')}", default=value,
                       help=f"job variable {var} (default {value})")

    def body() -> int:
        args = p.parse_args()
        directory = wl.target_dir(args.dir)
        env = {var: str(getattr(args, var.lower())) for var in defaults}
        # fio's files go to a private subdirectory, removed afterwards.
        work = Path(directory) / f"{folder.name}.{os.getpid()}"
        work.mkdir()
        env["DIR"] = str(work)
        raw = Path(args.raw or args.out + ".fio.json")
        try:
            start, end = run_job(folder / job, env, raw)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        doc = to_document(load_output(raw), args, workload=folder.name, directory=directory,
                          op_names=op_names, start=start, end=end, parameters=env)
        wl.write(doc, args.out)
        return 0

    wl.main(prog, body)


def parse_main(*, prog: str, folder: Path, op_names: dict[str, str]) -> None:
    """The whole `parse.py` of a fio workload folder: fio json+ file -> document."""
    p = wl.parser(prog, f"Turn fio json+ output of {folder.name} into a results document.")
    p.add_argument("fio_json", help="fio --output-format=json+ output")
    p.add_argument("--dir", required=True, help="the directory fio ran in (for the manifest)")
    p.add_argument("--out", required=True)

    def body() -> int:
        args = p.parse_args()
        doc_in = load_output(args.fio_json)
        parse(doc_in, op_names)  # malformed input ends here, as one line
        # fio stamps its output when the run ends; the longest job says when it began.
        try:
            end_s = float(doc_in.get("timestamp_ms", 0)) / 1000.0
            elapsed = max((float(j.get("elapsed", 0)) for j in doc_in["jobs"]), default=0)
        except MALFORMED as e:
            raise LabError(f"fio output is malformed ({type(e).__name__}: {e})"[:300]) from None
        doc = to_document(doc_in, args, workload=folder.name, directory=args.dir,
                          op_names=op_names, start=manifest.iso_from_unix(end_s - elapsed),
                          end=manifest.iso_from_unix(end_s),
                          parameters={"fio_time": str(doc_in.get("time", ""))})
        wl.write(doc, args.out)
        return 0

    wl.main(prog, body)
