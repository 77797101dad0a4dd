"""The gate and report of a `tierlab pair` directory on synthetic directories with
known content (testing.synthetic_pair_dir): nothing here depends on the machine's
timing. Each planted failure must fail exactly its criterion, plainly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tierlab import labgate
from tierlab.testing import assert_one_line_error, run, synthetic_pair_dir, tool

ALLOWED_ONLY = {"reconcile": {"write": (64, 64 << 20)}}


def crit(res: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in res["criteria"] if c["criterion"] == name)


def evaluate(d: Path, *sets: str) -> dict[str, Any]:
    return labgate.evaluate(labgate.load(d, list(sets)))


def test_aa_passes_every_criterion(tmp_path: Path) -> None:
    d = synthetic_pair_dir(tmp_path / "aa", hdd_during=ALLOWED_ONLY)
    res = evaluate(d)
    assert res["passed"], [c for c in res["criteria"] if not c["passed"]]
    assert res["a"] == "control" and res["b"] == "active"
    assert res["noise"]["pairs"] == 4 and res["noise"]["sigma"] > 0
    assert res["noise"]["pairs_needed"] >= 2


def test_slower_candidate_fails_p99_and_edge_inventory_names_the_flushes(tmp_path: Path) -> None:
    d = synthetic_pair_dir(tmp_path / "ab", arms=("baseline", "candidate"), b_scale=1.5,
                           hdd_during=ALLOWED_ONLY,
                           b_hdd_extra={"journal": {"flush": (321, 0)}})
    res = evaluate(d)
    assert not res["passed"]
    assert not crit(res, "p99 ratio")["passed"]
    assert "1.5" in crit(res, "p99 ratio")["text"] or "1.4" in crit(res, "p99 ratio")["text"]
    inv = crit(res, "edge inventory")
    assert not inv["passed"] and "journal flush" in inv["text"]
    assert crit(res, "fsck clean")["passed"] and crit(res, "throughput ratio")["passed"]
    # the report's table names the origin, op and count
    assert labgate.report_dir(d, tmp_path / "out", []) == 1
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Edge inventory" in md
    assert "| candidate | p00-candidate | hdd.b | journal | flush | 321 | 0 | - | - | NOT ALLOWED |" in md
    assert "| baseline | p00-baseline | hdd.b | journal |" not in md


def test_baseline_failing_as_badly_is_pre_existing_not_a_regression(tmp_path: Path) -> None:
    """Baseline against candidate: absolute criteria that the baseline fails as
    badly (origin names may differ between the builds) are marked pre-existing
    and named in the verdict; the gate passes. The same failures with
    active/control arms (one build) still fail it."""
    kw: dict[str, Any] = dict(hdd_during={"reconcile": {"write": (64, 64 << 20)}},
                              background_bytes=0, b_max_ns=31_000_000_000, a_max_ns=30_000_000_000)
    d = synthetic_pair_dir(tmp_path / "ab", arms=("baseline", "candidate"),
                           b_hdd_extra={"alloc": {"write": (3, 110592)}}, **kw)
    # the baseline's same writes under another origin name
    for run in (d / "runs").glob("*-baseline"):
        for edge in ("end", "idle"):
            p = run / f"ctl-{edge}.json"
            doc = json.loads(p.read_text())
            hdd = next(x for x in doc["devices"] if x["label"] == "hdd.b")
            hdd["io"]["btree"] = {"write": {"ops": 3, "bytes": 110592}, "errors": 0, "service_p50_ns": 1000}
            p.write_text(json.dumps(doc))
    res = evaluate(d)
    assert res["passed"], [c for c in res["criteria"] if not c["passed"]]
    assert res["preexisting"] == ["max latency (candidate)", "background work", "edge inventory"]
    for name in res["preexisting"]:
        c = crit(res, name)
        assert not c["passed"] and c["preexisting"] and "pre-existing: the baseline fails it as badly" in c["text"]
    assert "12 ops, 442368 bytes not allowed against 12 ops, 442368 bytes" in crit(res, "edge inventory")["text"]
    assert labgate.verdict_line(res) == ("gate: PASS (no regression; failing in the baseline as badly: "
                                         "max latency (candidate), background work, edge inventory)")
    assert labgate.report_dir(d, tmp_path / "out", []) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Gate: PASS (no regression;" in md and "- FAIL (pre-existing) edge inventory:" in md
    # one build in both arms: nothing is pre-existing
    same = evaluate(synthetic_pair_dir(tmp_path / "aa", **kw))
    assert not same["passed"] and same["preexisting"] == []
    assert not any(c.get("preexisting") for c in same["criteria"])


def test_candidate_worse_than_the_baseline_fails(tmp_path: Path) -> None:
    """A failure the baseline shares, but the candidate has more of it, is a regression."""
    d = synthetic_pair_dir(tmp_path / "ab", arms=("baseline", "candidate"),
                           hdd_during={"alloc": {"write": (3, 110592)}},
                           b_hdd_extra={"alloc": {"write": (9, 331776)}})
    res = evaluate(d)
    inv = crit(res, "edge inventory")
    assert not inv["passed"] and not inv.get("preexisting") and not res["passed"]
    assert res["preexisting"] == []
    d2 = synthetic_pair_dir(tmp_path / "ab2", arms=("baseline", "candidate"), hdd_during=ALLOWED_ONLY,
                            b_max_ns=31_000_000_000)  # only the candidate stalls
    res2 = evaluate(d2)
    m = crit(res2, "max latency (candidate)")
    assert not m["passed"] and not m.get("preexisting") and not res2["passed"]


def test_pre_existing_needs_the_baseline_to_fail_as_badly(tmp_path: Path) -> None:
    """A baseline that passes the criterion, or fails it much less badly, makes
    the candidate's failure a regression."""
    ab = dict(arms=("baseline", "candidate"), hdd_during=ALLOWED_ONLY)
    # background: bound 64 MiB; the baseline writes 100 MiB (passes), the candidate 60 MiB
    d = synthetic_pair_dir(tmp_path / "bg", background_bytes=100 << 20, **ab)
    for run in (d / "runs").glob("*-candidate"):
        p = run / "ctl-idle.json"
        doc = json.loads(p.read_text())
        hdd = next(x for x in doc["devices"] if x["label"] == "hdd.b")
        hdd["io"]["reconcile"]["write"] = {"ops": 60, "bytes": 60 << 20}
        p.write_text(json.dumps(doc))
    res = evaluate(d)
    c = crit(res, "background work")
    assert not c["passed"] and not c.get("preexisting") and not res["passed"], c
    # max latency: both over the 1 s bound, but the candidate's 60 s against the baseline's 2.1 s
    res = evaluate(synthetic_pair_dir(tmp_path / "max", b_max_ns=60_000_000_000, a_max_ns=2_100_000_000, **ab))
    c = crit(res, "max latency (candidate)")
    assert not c["passed"] and not c.get("preexisting") and not res["passed"], c
    # edge inventory: a clean baseline never makes the candidate's other origins pre-existing
    res = evaluate(synthetic_pair_dir(tmp_path / "inv", b_hdd_extra={"alloc": {"write": (3, 110592)}}, **ab))
    assert not crit(res, "edge inventory").get("preexisting") and not res["passed"]
    # foreground errors in both arms alike: pre-existing, and the verdict says so
    d = synthetic_pair_dir(tmp_path / "err", **ab)
    for name in ("p01-baseline", "p01-candidate"):
        p = d / "runs" / name / "probe.json"
        doc = json.loads(p.read_text())
        doc["measurements"]["counters"].update({"errors": 5, "errors_read": 5})
        p.write_text(json.dumps(doc))
    res = evaluate(d)
    c = crit(res, "foreground errors (candidate)")
    assert c["preexisting"] and "1 runs failing, 5 failed operations in all, against 1, 5 failed operations in all" in c["text"], c
    assert res["passed"] and res["preexisting"] == ["foreground errors (candidate)"]


def test_max_latency_fails_plainly_in_both_arms(tmp_path: Path) -> None:
    """A stall that freezes both arms alike: the comparative criteria pass, the
    absolute one fails, and the reference arm's failure is shown too."""
    d = synthetic_pair_dir(tmp_path / "stall", profile="stall", hdd_during=ALLOWED_ONLY,
                           b_max_ns=31_000_000_000, a_max_ns=30_500_000_000,
                           events=[{"at_s": 10, "member": "hdd.b", "command": "stall 30s",
                                    "duration_s": 30, "reply": "ok", "rc": 0, "unix": 0}])
    res = evaluate(d)
    assert crit(res, "p99 ratio")["passed"] and crit(res, "throughput ratio")["passed"]
    mb, ma = crit(res, "max latency (active)"), crit(res, "max latency (control)")
    assert not mb["passed"] and mb["gating"] and "4 of 4 runs above" in mb["text"]
    assert not ma["passed"] and not ma["gating"] and "31 s" in mb["text"]
    assert not res["passed"]
    assert labgate.report_dir(d, tmp_path / "out", []) == 1
    md = (tmp_path / "out" / "report.md").read_text()
    assert "FAIL max latency (active)" in md and "FAIL (not gated) max latency (control)" in md
    # every run's slow operations, per op
    assert "## Per run: all latency and operations above 50 ms" in md
    slow = json.loads((tmp_path / "out" / "summary.json").read_text())["runs_slow"]
    assert len(slow) == 8 and all(r["slow"] >= 1 for r in slow)
    assert "## Around each fault event" in md and (tmp_path / "out" / "events.png").is_file()


def test_each_planted_failure_fails_its_criterion(tmp_path: Path) -> None:
    cases = {
        "runs completed": dict(fail_run="p02-active"),
        "fsck clean": dict(dirty_run="p01-control"),
        "quiescence (active)": dict(quiescence=None),
        "background work": dict(background_bytes=1 << 20),
        "edge inventory": dict(hdd_during={"superblock": {"write": (2, 8192)}}),
        "foreground errors (active)": dict(errors_run="p03-active"),
    }
    for name, kw in cases.items():
        kw.setdefault("hdd_during", ALLOWED_ONLY)
        res = evaluate(synthetic_pair_dir(tmp_path / name.replace(" ", "_"), **kw))
        failed = [c["criterion"] for c in res["criteria"] if not c["passed"] and c["gating"]]
        assert name in failed, (name, failed)
        assert not res["passed"]
        if name == "foreground errors (active)":
            assert "p03-active 3 (read 3)" in crit(res, name)["text"]
        if name == "runs completed":
            assert "hung" in crit(res, name)["text"]
            assert crit(res, "p99 ratio")["passed"]  # the other 3 pairs still compare


def test_foreground_errors_gate_arm_b_and_show_arm_a(tmp_path: Path) -> None:
    res = evaluate(synthetic_pair_dir(tmp_path / "d", hdd_during=ALLOWED_ONLY,
                                      errors_run="p03-control"))
    a, b = crit(res, "foreground errors (control)"), crit(res, "foreground errors (active)")
    assert b["passed"] and b["gating"]
    assert not a["passed"] and not a["gating"]
    assert "p03-control 3 (read 3)" in a["text"] and "(reference arm: shown, not gated)" in a["text"]
    assert res["passed"]


def test_latency_table_gets_only_complete_pairs(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    d = synthetic_pair_dir(tmp_path / "d", hdd_during=ALLOWED_ONLY, fail_run="p02-active")
    seen: list[tuple[list[int], list[int]]] = []
    real = labgate.report_mod.compare

    def spy(ra, rb, g):  # type: ignore[no-untyped-def]
        seen.append(([r.manifest["pair"] for r in ra], [r.manifest["pair"] for r in rb]))
        return real(ra, rb, g)
    monkeypatch.setattr(labgate.report_mod, "compare", spy)
    labgate.report_dir(d, tmp_path / "out", [])
    assert seen == [([0, 1, 3], [0, 1, 3])]


def test_set_after_the_run_is_gate_only_and_visible(tmp_path: Path) -> None:
    d = synthetic_pair_dir(tmp_path / "d", b_scale=1.15, hdd_during=ALLOWED_ONLY)
    t = tool("tierlab")
    for bad in ("probe.rate=3", "phases.measure_s=5", "quiesce.window_s=2"):
        for cmd in ("gate", "report"):
            assert_one_line_error(run([t, cmd, d, "--set", bad]), 2,
                                  "only gate.* bounds can be changed")
    assert evaluate(d)["overrides"] == []
    proc = run([t, "gate", d, "--set", "gate.p99_ratio_max=1.5", "--json", tmp_path / "g.json"])
    assert "bounds overridden after the run: gate.p99_ratio_max=1.5" in proc.stdout
    assert json.loads((tmp_path / "g.json").read_text())["overrides"] == ["gate.p99_ratio_max=1.5"]
    out = tmp_path / "out"
    assert labgate.report_dir(d, out, ["gate.p99_ratio_max=1.5"]) == 0
    assert "bounds overridden after the run: gate.p99_ratio_max=1.5" in (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overrides"] == ["gate.p99_ratio_max=1.5"]
    assert summary["gate"]["overrides"] == ["gate.p99_ratio_max=1.5"]
    labgate.report_dir(d, tmp_path / "plain", [])
    assert "overridden" not in (tmp_path / "plain" / "report.md").read_text()


def test_bounds_come_from_the_profile_and_set_overrides(tmp_path: Path) -> None:
    d = synthetic_pair_dir(tmp_path / "d", b_scale=1.15, hdd_during=ALLOWED_ONLY)
    assert not crit(evaluate(d), "p99 ratio")["passed"]
    assert crit(evaluate(d, "gate.p99_ratio_max=1.5"), "p99 ratio")["passed"]
    t = tool("tierlab")
    assert run([t, "gate", d]).returncode == 1
    proc = run([t, "gate", d, "--set", "gate.p99_ratio_max=1.5", "--json", tmp_path / "g.json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS p99 ratio" in proc.stdout and "sigma(log per-pair p99 ratio)" in proc.stdout
    assert json.loads((tmp_path / "g.json").read_text())["passed"] is True
    assert_one_line_error(run([t, "gate", d, "--set", "gate.p99_ratio_max=-1"]), 2,
                          "gate.p99_ratio_max")
    assert_one_line_error(run([t, "gate", tmp_path]), 2, "not a tierlab pair directory")


def test_report_of_a_directory(tmp_path: Path) -> None:
    d = synthetic_pair_dir(tmp_path / "d", hdd_during=ALLOWED_ONLY)
    proc = run([tool("tierlab"), "report", d])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = d / "report"
    md = (out / "report.md").read_text()
    for section in ("## Gate: PASS", "## Per pair: all p99", "## Edge inventory", "## Runs",
                    "## Latency by op", "Slot bias"):
        assert section in md, section
    html = (out / "report.html").read_text()
    assert html.count("<img ") >= 2 and "data:image/png;base64," in html
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["pairs"]) == 4 and summary["gate"]["passed"] is True


def test_edge_inventory_also_counts_what_the_fault_device_saw(tmp_path: Path) -> None:
    """I/O that goes around tierfs's queue (mount's superblocks) is counted only by
    the fault device: it still shows, and still fails the inventory."""
    d = synthetic_pair_dir(tmp_path / "d", hdd_during=ALLOWED_ONLY)
    for run_dir in (d / "runs").iterdir():
        p = run_dir / "ctl-end.json"
        doc = json.loads(p.read_text())
        for dev in doc["devices"]:
            if dev["label"] == "hdd.b":
                dev["fault"] = {"io": {"superblock": {"write": {"ops": 2, "bytes": 8192}}}}
        p.write_text(json.dumps(doc))
    res = evaluate(d)
    inv = crit(res, "edge inventory")
    assert not inv["passed"] and "superblock write" in inv["text"]
    labgate.report_dir(d, tmp_path / "out", [])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| active | p00-active | hdd.b | superblock | write | 0 | 0 | 2 | 8192 | NOT ALLOWED |" in md


def test_spill_criterion_needs_user_data_on_the_slow_members_in_every_run(tmp_path: Path) -> None:
    """gate.spill_min_bytes (the spill profile's condition): a run whose fast tier
    never filled wrote no user data to the HDD and fails the criterion, in either
    arm; without the bound the criterion is not there."""
    spilled = {"reconcile": {"write": (64, 64 << 20)}, "foreground_write": {"write": (96, 96 << 20)}}
    bound = ("gate.spill_min_bytes=64MiB", "gate.allowlist=[\"reconcile\",\"foreground_write\"]")
    res = evaluate(synthetic_pair_dir(tmp_path / "yes", hdd_during=spilled), *bound)
    assert crit(res, "spill")["passed"] and res["passed"], crit(res, "spill")
    assert "least user data written to hdd members during the measured phase: 96MiB" in crit(
        res, "spill")["text"]
    res = evaluate(synthetic_pair_dir(tmp_path / "no", hdd_during=ALLOWED_ONLY), *bound)
    c = crit(res, "spill")
    assert not c["passed"] and c["gating"] and not res["passed"]
    assert "the condition did not happen in: p00-control 0 B, p01-control 0 B" in c["text"]
    assert "p03-active 0 B" in c["text"]
    assert all(x["criterion"] != "spill" for x in evaluate(
        synthetic_pair_dir(tmp_path / "off", hdd_during=spilled))["criteria"])


def test_report_says_when_the_control_arm_is_the_active_arm(tmp_path: Path) -> None:
    """The "A/A comparison" note: when `pause all` failed, and when it worked
    but no engine had work (every engine `off` at the start edge); none once
    an engine runs."""
    def pair_with(rc: int, state: str | None) -> str:
        d = synthetic_pair_dir(tmp_path / f"d{rc}{state}", hdd_during=ALLOWED_ONLY)
        for run_dir in (d / "runs").iterdir():
            info = json.loads((run_dir / "run.json").read_text())
            if info["arm"] == "control":
                info["pause"] = {"rc": rc, "reply": "ok paused: reconcile promote copygc" if rc == 0
                                 else "tierfs ctl: unknown command 'pause' (fault)"}
                (run_dir / "run.json").write_text(json.dumps(info))
            if state is not None:
                p = run_dir / "ctl-start.json"
                doc = json.loads(p.read_text())
                doc["engines"] = {"reconcile": {"state": state, "paused": False},
                                  "promote": {"state": "off"}}
                doc["budget"] = [{"limit": 8}]
                p.write_text(json.dumps(doc))
        assert labgate.report_dir(d, tmp_path / f"out{rc}{state}", []) == 0
        return (tmp_path / f"out{rc}{state}" / "report.md").read_text()

    md = pair_with(1, None)
    assert "is not available in this build" in md and "A/A comparison" in md
    md = pair_with(0, "off")
    assert "no engine has work in this build" in md and "A/A comparison" in md
    md = pair_with(0, "idle")
    assert "A/A comparison" not in md
    md = pair_with(0, None)  # (no engines in the snapshots: nothing to say)
    assert "A/A comparison" not in md
