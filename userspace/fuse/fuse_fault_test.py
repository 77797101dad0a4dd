"""Fault devices under tierfs (`--fault MEMBER=PROFILE`, `tierfs ctl MNT fault ...`):
the options' one-line errors on every command, the fault device really in the
member's I/O path (an injected EIO on the HDD's primary superblock is seen by
`show` and `fsck`), and a mounted filesystem's fault devices controlled and read
through ctl: a stall that holds HDD I/O while an SSD-only fsync completes, unstall,
run-time error ranges, power cut and power on, and per-origin counts that agree
with tierfs's own."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from fusetest import fsck_clean, needs_fuse, umount, wait_for
from tierlab.testing import assert_one_line_error, run, tool


def images(tmp_path: Path) -> list[Path]:
    ssd, hdd = tmp_path / "ssd.img", tmp_path / "hdd.img"
    for p, mib in ((ssd, 128), (hdd, 256)):
        with open(p, "wb") as f:
            f.truncate(mib << 20)
    proc = run([tool("tierfs"), "format", "--label", "ssd.a", ssd, "--label", "hdd.b", hdd,
                "--foreground-target", "ssd", "--metadata-target", "ssd", "--background-target", "hdd",
                "--bucket-size", "256K", "--fault", "hdd.b=hdd-fixed-10ms"])
    assert proc.returncode == 0, proc.stderr
    return [ssd, hdd]


BAD = [
    (["--fault", "hdd.b"], 2, "want MEMBER=PROFILE"),
    (["--fault", "=hdd-7200"], 2, "want MEMBER=PROFILE"),
    (["--fault", "hdd.b=no-such-profile"], 2, "no such profile"),
    (["--fault", "hdd.b=hdd-7200", "--fault", "hdd.b=nvme"], 2, "has a fault profile already"),
    (["--fault", "hdd.b=hdd-7200", "--fault-set", "hdd.b:delay.bogus=1"], 2, "delay.bogus: unknown key"),
    (["--fault", "hdd.b=hdd-7200", "--fault-set", "hdd.b:delay.all_ms=\"x\""], 2, "must be a number"),
    (["--fault", "hdd.b=hdd-7200", "--fault-set", "hdd.c:delay.all_ms=1"], 2, "no --fault for hdd.c"),
    (["--fault", "hdd.b=hdd-7200", "--fault-set", "hdd.b"], 2, "want MEMBER:KEY=VALUE"),
    (["--fault", "hdd.x=hdd-7200"], 1, "no member has that label or path (members: ssd.a"),
    (["--fault", "hdd.b=hdd-7200", "--fault", "HDDPATH=nvme"], 1, "has a fault profile already"),
    (["--fault", "hdd.b=hdd-flaky", "--fault-set", "hdd.b:errors=[{offset=0,length=1099511627776}]"], 1,
     "beyond"),
]


@pytest.mark.parametrize("cmd", ["show", "fsck", "format"])
@pytest.mark.parametrize("extra,rc,needle", BAD)
def test_fault_options_reject_bad_input(tmp_path: Path, cmd: str, extra: list[str], rc: int,
                                        needle: str) -> None:
    devs = images(tmp_path)
    before = [p.read_bytes()[:1 << 16] for p in devs]
    args = [tool("tierfs"), cmd]
    if cmd == "format":
        args += ["--force", "--label", "ssd.a", devs[0], "--label", "hdd.b", devs[1]]
    else:
        args += devs
    proc = run([*args, *[a.replace("HDDPATH", str(devs[1])) for a in extra]])
    # fsck(8): a command-line mistake is 16, any other failure to run 8.
    want = (16 if rc == 2 else 8) if cmd == "fsck" else rc
    assert_one_line_error(proc, want, needle)
    assert [p.read_bytes()[:1 << 16] for p in devs] == before, "a refused command wrote"


def test_fault_device_is_in_the_members_path(tmp_path: Path) -> None:
    devs = images(tmp_path)
    eio = ["--fault", "hdd.b=passthrough", "--fault-set",
           'hdd.b:errors=[{offset=4096,length=4096,ops="read"}]']
    proc = run([tool("tierfs"), "show", *devs, *eio])
    assert proc.returncode == 0, proc.stderr
    assert "primary superblock unusable" in proc.stderr and "I/O error" in proc.stderr
    proc = run([tool("tierfs"), "show", *devs])
    assert proc.returncode == 0 and "unusable" not in proc.stderr, proc.stderr
    # --fault before the devices takes one value, not a device path after it.
    proc = run([tool("tierfs"), "show", "--fault", "hdd.b=passthrough", "--fault-set",
                'hdd.b:errors=[{offset=4096,length=4096,ops="read"}]', *devs])
    assert proc.returncode == 0 and "primary superblock unusable" in proc.stderr, proc.stderr
    # A path names the member as well as its label does.
    proc = run([tool("tierfs"), "fsck", *devs, "--fault", f"{devs[1]}=hdd-fixed-10ms"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def ctl(mnt: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return run([tool("tierfs"), "ctl", mnt, *words])


def stats(mnt: Path) -> dict[str, Any]:
    proc = ctl(mnt)
    assert proc.returncode == 0, proc.stderr
    return {d["label"]: d for d in json.loads(proc.stdout)["devices"]}


@contextlib.contextmanager
def fault_mount(tmp_path: Path, *fault_args: str) -> Iterator[tuple[list[Path], Path]]:
    """A foreground `tierfs mount -f` of fresh images with FAULT_ARGS; on the way
    out it unmounts, waits for the daemon (exit 0) and requires fsck clean."""
    devs = images(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    daemon = subprocess.Popen([str(tool("tierfs")), "mount", "-f", *map(str, devs), str(mnt), *fault_args],
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.ismount(mnt) or daemon.poll() is not None, "the mount")
        assert os.path.ismount(mnt), daemon.stderr.read() if daemon.stderr else ""
        yield devs, mnt
    finally:
        if os.path.ismount(mnt):
            umount(mnt)
        try:
            rc = daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
    assert rc == 0, daemon.stderr.read() if daemon.stderr else ""
    fsck_clean(devs)


# The ctl reply is one ioctl of at most 16000 bytes (its size field has 14
# bits; userspace/fuse/ctl.h); a longer document is ENOSPC. The lab mounts up
# to three members, each over a fault device: that document, with I/O of
# several kinds behind it, must leave room for counters still to come.
CTL_MAX = 16000
CTL_HEADROOM = 4000


@needs_fuse
def test_the_ctl_document_of_three_faulted_members_has_room(tmp_path: Path) -> None:
    devs = [tmp_path / f"{n}.img" for n in ("ssd", "hdd1", "hdd2")]
    for p, mib in zip(devs, (128, 256, 256)):
        with open(p, "wb") as f:
            f.truncate(mib << 20)
    proc = run([tool("tierfs"), "format", "--label", "ssd.a", devs[0], "--label", "hdd.b", devs[1],
                "--label", "hdd.c", devs[2], "--foreground-target", "ssd", "--metadata-target", "ssd",
                "--background-target", "hdd", "--bucket-size", "256K"])
    assert proc.returncode == 0, proc.stderr
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    faults = ["--fault", "ssd.a=passthrough", "--fault", "hdd.b=passthrough", "--fault", "hdd.c=passthrough"]
    daemon = subprocess.Popen([str(tool("tierfs")), "mount", "-f", *map(str, devs), str(mnt), *faults],
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.ismount(mnt) or daemon.poll() is not None, "the mount")
        assert os.path.ismount(mnt), daemon.stderr.read() if daemon.stderr else ""
        for i in range(40):
            (mnt / f"d{i % 4}").mkdir(exist_ok=True)
            with open(mnt / f"d{i % 4}" / f"f{i}", "wb") as out:
                out.write(os.urandom(300_000))
                if i % 5 == 0:
                    os.fsync(out.fileno())
        os.sync()
        for i in range(40):
            (mnt / f"d{i % 4}" / f"f{i}").read_bytes()
        proc = ctl(mnt)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert [d["fault"]["profile"] for d in doc["devices"]] == ["passthrough"] * 3
        size = len(proc.stdout.encode())
        print(f"ctl document of three faulted members: {size} bytes")
        assert size + CTL_HEADROOM < CTL_MAX, f"ctl document {size} bytes: near its ioctl's limit"
    finally:
        if os.path.ismount(mnt):
            umount(mnt)
        daemon.wait(timeout=60)
    fsck_clean(devs)


@needs_fuse
def test_mounted_fault_devices_through_ctl(tmp_path: Path) -> None:
    with fault_mount(tmp_path, "--fault", "hdd.b=hdd-fixed-10ms",
                     "--fault-set", "hdd.b:delay.all_ms=2") as (devs, mnt):
        s = stats(mnt)
        assert s["ssd.a"]["fault"] is None and s["ssd.a"]["path"] == str(devs[0])
        f = s["hdd.b"]["fault"]
        assert f["profile"] == "hdd-fixed-10ms" and f["stalled"] is False and f["powered"] is True
        # Whatever tierfs's queue sent, the fault device saw, origin by origin (it
        # sees more: the superblock I/O of mount goes around the queue).
        for origin, by_op in s["hdd.b"]["io"].items():
            for op, n in by_op.items():
                if isinstance(n, dict):
                    assert n["ops"] <= f["io"][origin][op]["ops"], (origin, op)
        assert f["io"]["superblock"]["write"]["ops"] >= 1  # the mount marked it in use

        proc = ctl(mnt, "fault", "hdd.b", "stall", "60s")
        assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr
        f = stats(mnt)["hdd.b"]["fault"]
        assert f["stalled"] is True and f["stall_remaining_ms"] > 30_000
        # An SSD-only fsync completes while the HDD is stalled: it needs nothing
        # of the HDD (this one small commit does not reach the throttle that
        # waits for the allocator checkpoint, see docs/benchmarks.md's lab
        # section). Half the stall as a bound: it tells "waited for the HDD"
        # from "was slow".
        t0 = time.monotonic()
        with open(mnt / "fast", "wb") as out:
            out.write(os.urandom(1 << 20))
            out.flush()
            os.fsync(out.fileno())
        assert time.monotonic() - t0 < 30, "an SSD-only fsync waited for the stalled HDD"
        assert stats(mnt)["hdd.b"]["fault"]["stalled"] is True
        proc = ctl(mnt, "fault", "hdd.b", "unstall")
        assert proc.returncode == 0 and proc.stdout.strip() == "ok unstalled", proc.stderr
        assert stats(mnt)["hdd.b"]["fault"]["stalled"] is False

        proc = ctl(mnt, "fault", "hdd.b", "error", "write", "100MiB+1MiB")
        assert proc.returncode == 0, proc.stderr
        assert stats(mnt)["hdd.b"]["fault"]["error_ranges_active"] == 1
        assert ctl(mnt, "fault", "hdd.b", "clear").returncode == 0
        assert stats(mnt)["hdd.b"]["fault"]["error_ranges_active"] == 0

        full = ctl(mnt, "fault", "hdd.b", "stats")
        assert full.returncode == 0
        assert json.loads(full.stdout)["profile"] == "hdd-fixed-10ms"

        assert_one_line_error(ctl(mnt, "fault", "ssd.a", "stall", "1"), 1, "no fault device under this member")
        assert_one_line_error(ctl(mnt, "fault", "hdd.x", "stall", "1"), 1, "no member has that label")
        assert_one_line_error(ctl(mnt, "fault", "hdd.b", "stall"), 2, "usage: stall DURATION")
        assert_one_line_error(ctl(mnt, "fault", "hdd.b", "stall", "3h"), 2, "usage: stall DURATION")
        assert_one_line_error(ctl(mnt, "fault", "hdd.b", "error", "read", "1T+4K"), 1, "outside the device")
        assert_one_line_error(ctl(mnt, "fault", "hdd.b", "frob"), 2, "unknown command 'frob'")
        assert_one_line_error(ctl(mnt, "fault"), 2, "usage: fault MEMBER COMMAND")
        assert_one_line_error(ctl(mnt, "frob"), 2, "unknown command 'frob' (pause, resume, fault)")

        proc = ctl(mnt, "fault", "hdd.b", "powercut", "7")
        assert proc.returncode == 0 and "power cut" in proc.stdout, proc.stderr
        assert stats(mnt)["hdd.b"]["fault"]["powered"] is False
        assert stats(mnt)["hdd.b"]["fault"]["injected"]["power_cuts"] == 1
        assert ctl(mnt, "fault", "hdd.b", "poweron").returncode == 0
        assert stats(mnt)["hdd.b"]["fault"]["powered"] is True
        assert (mnt / "fast").stat().st_size == 1 << 20


@needs_fuse
def test_ctl_pauses_and_resumes_the_engines(tmp_path: Path) -> None:
    """The background engines' switches (fs/mount/control.h): the lab's
    control arm runs `tierfs ctl MNT pause all`."""
    with fault_mount(tmp_path) as (_, mnt):
        def engines() -> dict[str, Any]:
            proc = ctl(mnt)
            assert proc.returncode == 0, proc.stderr
            return json.loads(proc.stdout)["engines"]

        assert sorted(engines()) == ["copygc", "promote", "reconcile"]
        assert not any(e["paused"] for e in engines().values())
        doc = json.loads(ctl(mnt).stdout)
        assert [b["limit"] for b in doc["budget"]] == [8] * len(doc["devices"]), doc["budget"]
        proc = ctl(mnt, "pause", "all")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok paused: reconcile promote copygc\n", "")
        assert all(e["paused"] and e["pauses"] == 1 for e in engines().values())
        proc = ctl(mnt, "resume", "copygc")
        assert (proc.returncode, proc.stdout) == (0, "ok resumed: copygc\n"), proc.stderr
        assert {n: e["paused"] for n, e in engines().items()} == {
            "reconcile": True, "promote": True, "copygc": False}
        assert_one_line_error(ctl(mnt, "pause"), 2, "pause: usage: pause ENGINE...")
        assert_one_line_error(ctl(mnt, "resume", "all", "mover"), 2,
                              "resume: unknown engine 'mover' (reconcile, promote, copygc, all)")
        assert engines()["reconcile"]["paused"] is True, "a refused line changes nothing"
        assert ctl(mnt, "resume", "all").returncode == 0
        assert not any(e["paused"] for e in engines().values())


def test_ctl_fault_on_something_else(tmp_path: Path) -> None:
    assert_one_line_error(ctl(tmp_path, "fault", "hdd.b", "stall", "1"), 1, "not a tierfs mount")
    assert_one_line_error(ctl(tmp_path, "pause", "all"), 1, "not the root of a mounted tierfs filesystem")


@needs_fuse
def test_probe_counts_the_errors_of_a_failing_member(tmp_path: Path) -> None:
    """tierprobe --keep-going over a member whose reads fail: every read is
    counted as an error (EIO from the fault device, through tierfs and FUSE), the
    other ops go on, and the run still writes its document."""
    with fault_mount(tmp_path, "--fault", "ssd.a=passthrough") as (_devs, mnt):
        assert ctl(mnt, "fault", "ssd.a", "error", "read", "0+128MiB").returncode == 0
        out = tmp_path / "probe.json"
        proc = run([tool("tierprobe"), "--dir", mnt, "--rate", "100", "--duration", "1s", "--json", out,
                    "--mix", "read=1,stat=1", "--direct", "--keep-going", "--working-set", "1M",
                    "--files", "4"])
        assert proc.returncode == 0, proc.stderr
        assert "Input/output error" in proc.stderr
        doc = json.loads(out.read_text())
        c, ops = doc["measurements"]["counters"], doc["measurements"]["ops"]
        assert c["errors_read"] > 0 and c["errors"] == c["errors_read"]
        assert c["errors_read"] + ops["stat"]["latency"]["count"] == 100  # constant arrivals: all accounted
        assert ops["read"]["latency"]["count"] == 0
        assert stats(mnt)["ssd.a"]["fault"]["injected"]["eio"] >= c["errors_read"]
        assert ctl(mnt, "fault", "ssd.a", "clear").returncode == 0


@needs_fuse
def test_probe_createsync_is_a_durable_create(tmp_path: Path) -> None:
    """tierprobe's createsync commits each create durably (the spill profile's
    SSD-only fsync): a journal flush reaches the SSD per op (or per pair of ops
    that overlap), where plain create needs none."""
    with fault_mount(tmp_path, "--fault", "ssd.a=passthrough") as (_devs, mnt):
        def flushes() -> int:
            io = stats(mnt)["ssd.a"]["fault"]["io"]
            return int(io.get("journal", {}).get("flush", {}).get("ops", 0))

        seen = {}
        for op in ("create", "createsync"):
            out = tmp_path / f"{op}.json"
            before = flushes()
            proc = run([tool("tierprobe"), "--dir", mnt, "--rate", "50", "--duration", "1s", "--json", out,
                        "--mix", f"{op}=1", "--working-set", "1M", "--files", "4"])
            assert proc.returncode == 0, proc.stderr
            ops = json.loads(out.read_text())["measurements"]["ops"]
            assert set(ops) == {op, "all"} and ops[op]["latency"]["count"] == 50
            seen[op] = flushes() - before - 1  # the working set's own fsync
        # Group commit may let two createsyncs in flight at once share a flush
        # (on a loaded machine an op can outlast the 20 ms between arrivals: 48
        # of 50 seen), so not one per op; but far more than plain create's.
        assert seen["createsync"] >= 25 and seen["create"] < 25, seen


@needs_fuse
@pytest.mark.parametrize("fault", ["checksum", "eio"])
def test_a_bad_copy_is_read_past_and_rewritten(tmp_path: Path, fault: str) -> None:
    """--replicas 2 over two SSD members, each under a fault device: ssd.a's copy
    of a file's block damaged on its image (a checksum mismatch) or failing its
    reads (an EIO range set through ctl). An O_DIRECT read returns the block
    from ssd.b's copy (ssd.a's queued: data.repairs_queued), the mount's repair
    worker rewrites ssd.a's copy there (data.repaired; the image then holds the
    block again at a new offset), the unmount is clean, fsck is clean and a
    remount reads the file (docs/design/copies.md, "Step 6b"). ssd.a is read
    first: it is the promote target (the fast tier goes first before latencies
    are known) and ssd.b answers 50 ms late (clearly slower after); a read that
    met the bad copy queued it, by a retry or after a hedge (a few reads: one
    whose hedge to ssd.b answered first never looked at ssd.a's answer)."""
    devs = [tmp_path / "a.img", tmp_path / "b.img"]
    for p in devs:
        with open(p, "wb") as f:
            f.truncate(64 << 20)
    proc = run([tool("tierfs"), "format", "--label", "ssd.a", devs[0], "--label", "ssd.b", devs[1],
                "--replicas", "2", "--promote-target", "ssd.a", "--bucket-size", "256K"])
    assert proc.returncode == 0, proc.stderr
    block = bytes(range(256)) * 16  # 4 KiB, found again on the images
    content = b"\0" * 4096 + block + b"\1" * 4096
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def start() -> subprocess.Popen[str]:
        d = subprocess.Popen([str(tool("tierfs")), "mount", "-f", *map(str, devs), str(mnt),
                              "--fault", "ssd.a=passthrough", "--fault", "ssd.b=passthrough",
                              "--fault-set", "ssd.b:delay.all_ms=50"],
                             stderr=subprocess.PIPE, text=True)
        wait_for(lambda: os.path.ismount(mnt) or d.poll() is not None, "the mount")
        assert os.path.ismount(mnt), d.stderr.read() if d.stderr else ""
        return d

    def stop(d: subprocess.Popen[str]) -> str:
        umount(mnt)
        rc = d.wait(timeout=60)
        err = d.stderr.read() if d.stderr else ""
        assert rc == 0, err
        return err

    def data() -> dict[str, Any]:
        p = ctl(mnt)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["data"]

    def read_block() -> bytes:
        fd = os.open(mnt / "f", os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 4096)
            assert os.preadv(fd, [buf], 4096) == 4096
            return buf[:]
        finally:
            os.close(fd)

    d = start()
    (mnt / "f").write_bytes(content)
    stop(d)
    fsck_clean(devs)
    img = bytearray(devs[0].read_bytes())
    at = img.find(block)
    assert at > 0 and img.find(block, at + 1) < 0
    if fault == "checksum":
        img[at + 100] ^= 0xFF
        devs[0].write_bytes(bytes(img))
    d = start()
    if fault == "eio":
        p = ctl(mnt, "fault", "ssd.a", "error", "read", f"{at}+4K")
        assert p.returncode == 0, p.stderr
    for _ in range(20):
        assert read_block() == block
        if data()["repairs_queued"] >= 1:
            break
    wait_for(lambda: data()["repaired"] >= 1, "the repair worker's rewrite", timeout=60)
    c = data()
    assert c["repairs_queued"] == 1 and c["repaired"] == 1 and c["repair_failed"] == 0, c
    assert c["read_retries"] + c["hedged"] >= 1 and c["csum_errors"] == (1 if fault == "checksum" else 0), c
    assert read_block() == block
    if fault == "checksum":  # (after an EIO the member ranks last for 10 s: the read goes elsewhere)
        assert data()["read_retries"] == c["read_retries"], "the repaired copy failed a read again"
    assert ctl(mnt, "fault", "ssd.a", "clear").returncode == 0
    err = stop(d)
    assert "the copy on member 0" in err and "was rewritten there" in err, err
    fsck_clean(devs)
    img = devs[0].read_bytes()
    found_at, k = [], img.find(block)
    while k >= 0:
        found_at.append(k)
        k = img.find(block, k + 1)
    assert [k for k in found_at if k != at], "no intact copy of the block at a new offset on the member"
    d = start()
    assert (mnt / "f").read_bytes() == content
    stop(d)
    fsck_clean(devs)
