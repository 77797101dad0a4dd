"""Loading and validating results documents (results/schema/run-v1.schema.json).

validate() checks the JSON schema with Debian's python3-jsonschema and then what a
schema cannot say: bucket counts add up to the histogram's count, buckets are
tfs::Histogram's buckets, min <= max, start <= end. Every producer's output goes
through it (the producers call it before writing; the tests call it on their
output), so a report never has to second-guess its input."""

from __future__ import annotations

import json
import re
from datetime import datetime
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from tierlab import RESULTS_DIR, LabError
from tierlab.hist import bucket_high, bucket_index

SCHEMA_PATH = RESULTS_DIR / "schema" / "run-v1.schema.json"
FORMAT = "tierfs-results"
VERSION = 1


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "(top)"


def _check_histogram(h: dict[str, Any], where: str) -> None:
    total = 0
    prev_high = -1
    for low, high, n in h["buckets"]:
        idx = bucket_index(low)
        if bucket_high(idx) != high or low <= prev_high:
            raise LabError(f"{where}: bucket [{low}, {high}] is not a tfs::Histogram bucket "
                           "in ascending order")
        prev_high = high
        total += n
    if total != h["count"]:
        raise LabError(f"{where}: buckets hold {total} operations but count is {h['count']}")
    if h["count"] > 0 and h["min"] > h["max"]:
        raise LabError(f"{where}: min {h['min']} > max {h['max']}")


TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?Z")


def _instant(ts: str, where: str) -> tuple[datetime, Fraction]:
    """A schema timestamp as a comparable value: whole seconds and the exact
    fraction (the fraction's digits are optional and of any number, so the
    strings do not sort as times: "05.5Z" < "05Z")."""
    m = TIMESTAMP.fullmatch(ts)
    if m is None:
        raise LabError(f"{where}: '{ts}' is not a UTC timestamp")
    try:
        whole = datetime(*(int(g) for g in m.groups()[:6]))
    except ValueError as e:
        raise LabError(f"{where}: '{ts}' is not a valid time: {e}") from None
    digits = m.group(7) or "0"
    return whole, Fraction(int(digits), 10 ** len(digits))


def validate(doc: Any, name: str = "document") -> None:
    """Raises LabError naming the first problem; returns None when `doc` is valid."""
    try:
        errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise LabError(f"{name}: {_where(e.absolute_path)}: {e.message}{more}"[:400])
    except RecursionError:  # the message quotes the offending value
        raise LabError(f"{name}: nested too deeply to be a results document") from None
    for op, stats in doc["measurements"]["ops"].items():
        for kind, h in stats.items():
            _check_histogram(h, f"{name}: measurements/ops/{op}/{kind}")
    m = doc["manifest"]
    if (_instant(m["start"], f"{name}: manifest/start")
            > _instant(m["end"], f"{name}: manifest/end")):
        raise LabError(f"{name}: manifest/start {m['start']} is after end {m['end']}")


def load(path: str | Path) -> dict[str, Any]:
    """Reads and validates one results document."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise LabError(f"{p}: no such file") from None
    except OSError as e:
        raise LabError(f"{p}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise LabError(f"{p}: not JSON: byte {e.start} is not UTF-8") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LabError(f"{p}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise LabError(f"{p}: JSON nested too deeply to be a results document") from None
    validate(doc, str(p))
    return doc


def write(doc: dict[str, Any], path: str | Path) -> None:
    """Validates, then writes atomically (a reader never sees half a document)."""
    validate(doc, str(path))
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(p)
    except OSError as e:
        raise LabError(f"{p}: cannot write: {e.strerror}") from None
