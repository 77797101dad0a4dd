"""The results schema accepts what producers write and rejects broken documents
with a one-line message naming the place."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tierlab import LabError, schema
from tierlab.testing import synthetic_run


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema._validator()  # check_schema() raises when the schema itself is wrong


def test_synthetic_document_is_valid() -> None:
    schema.validate(synthetic_run(seed=1))


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.pop("manifest"), "'manifest' is a required property"),
    (lambda d: d["manifest"].update(arm="blue"), "manifest/arm"),
    (lambda d: d["manifest"].update(start="yesterday"), "manifest/start"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["measurements"]["ops"]["read"]["latency"]["buckets"].append([1, 2]),
     "measurements/ops/read/latency/buckets"),
    (lambda d: d["measurements"]["ops"]["read"]["latency"].update(count=1),
     "buckets hold"),
    (lambda d: d["measurements"]["ops"]["read"]["latency"]["buckets"][0].__setitem__(1, 10**6),
     "is not a tfs::Histogram bucket"),
    (lambda d: d["manifest"].update(end="2025-01-01T00:00:00Z"), "is after end"),
    (lambda d: d["manifest"].update(start="2026-01-01T00:00:05.5Z", end="2026-01-01T00:00:05Z"),
     "is after end"),
    (lambda d: d["manifest"].update(start="2026-01-01T00:00:05.25Z",
                                    end="2026-01-01T00:00:05.2Z"), "is after end"),
    (lambda d: d["manifest"].update(end="2026-13-01T00:00:00Z"), "manifest/end"),
    (lambda d: d["measurements"]["ops"].update({"Bad Op": {}}), "measurements/ops"),
])
def test_broken_documents_are_rejected(breakage, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = copy.deepcopy(synthetic_run(seed=2))
    breakage(doc)
    with pytest.raises(LabError) as e:
        schema.validate(doc, "x.json")
    text = str(e.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize("start, end", [
    ("2026-01-01T00:00:05Z", "2026-01-01T00:00:05.5Z"),      # "05.5Z" < "05Z" as strings
    ("2026-01-01T00:00:05.5Z", "2026-01-01T00:00:05.50001Z"),
    ("2026-01-01T00:00:05.9Z", "2026-01-01T00:00:05.900Z"),   # the same instant
    ("2026-01-01T00:00:05.999999999Z", "2026-01-01T00:00:06Z"),
])
def test_start_and_end_compare_as_times(start: str, end: str) -> None:
    doc = synthetic_run(seed=2)
    doc["manifest"].update(start=start, end=end)
    schema.validate(doc)


def test_load_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no such file"):
        schema.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LabError, match="not JSON"):
        schema.load(bad)


def test_write_validates_and_is_atomic(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    schema.write(synthetic_run(seed=3), out)
    assert json.loads(out.read_text())["format"] == "tierfs-results"
    broken = synthetic_run(seed=3)
    broken["manifest"]["arm"] = "nope"
    with pytest.raises(LabError):
        schema.write(broken, tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()
