"""Tests of one VM lab boot (vmboot.py, `tierlab vm boot`): argument mistakes,
the job and results disk formats, a launcher that cannot start its guest (a
failed boot, every child gone; no QEMU needed), and two real boots of the real
image under QEMU -- tierfs on two NBD fault members (formatted, mounted with
FUSE, written, read, probed, unmounted; then fsck'd on the host), and a guest
that never powers off, killed at its timeout. The real boots are skipped, saying
why, only when qemu-system-x86_64 is missing or the image cannot be built."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tierlab import LabError, vmboot, vmimage
from tierlab.testing import assert_one_line_error, boot_tierfs_job, build_dir, run, tool


# ------------------------------------------------------------------ mistakes

@pytest.mark.parametrize("spec,needle", [
    ("ssd.a", "bad member 'ssd.a': want LABEL=SIZE[:FAULTPROFILE]"),
    ("ssd.a=", "bad member"),
    ("ssda=1G", "bad member label 'ssda': want GROUP.NAME"),
    ("ssd.a=12Q", "member ssd.a: want a size"),
    ("ssd.a=1000", "whole number of MiB"),
    ("hdd.b=1G:hdd-no-such-profile", "unknown fault profile 'hdd-no-such-profile' (known: "),
    ("hdd.b=1G:/no/such/profile.toml", "fault profile file /no/such/profile.toml does not exist"),
    ("a.bcdefghijklmnopqrstuvwxyz=1G", "longer than 20 bytes"),
])
def test_bad_member_spec(spec: str, needle: str, tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    p = run([tool("tierlab"), "vm", "boot", "--member", spec, "--job", job, "--out", tmp_path / "out"])
    assert_one_line_error(p, 2, "tierlab vm boot: ", needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("event,needle", [
    ("10:hdd.b", "want T:LABEL:COMMAND"),
    ("x:hdd.b:stall 1", "bad duration"),
    ("10:hdd.z:stall 1", "names no member"),
    ("10:hdd.b:explode", "unknown command 'explode'"),
])
def test_bad_event(event: str, needle: str, tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    p = run([tool("tierlab"), "vm", "boot", "--member", "hdd.b=64M", "--event", event,
             "--job", job, "--out", tmp_path / "out"])
    assert_one_line_error(p, 2, "tierlab vm boot: ", needle)


def test_member_and_event_parsing() -> None:
    m = vmboot.parse_member("hdd.b=2GiB:hdd-fixed-10ms")
    assert (m.label, m.size, m.profile, m.serve_profile) == ("hdd.b", 2 << 30, "hdd-fixed-10ms", "hdd-fixed-10ms")
    assert vmboot.parse_member("ssd.a=64M").serve_profile == "passthrough"
    e = vmboot.parse_event("30:hdd.b:stall 10", ["hdd.b"])
    assert (e.at_s, e.label, e.command) == (30.0, "hdd.b", ["stall", "10"])
    assert vmboot.parse_event("500ms:hdd.b:error read 16MiB+1MiB", ["hdd.b"]).at_s == 0.5


def test_job_disk_is_a_padded_tar(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("echo hi\n")
    data_in = tmp_path / "data.bin"
    data_in.write_bytes(b"\x01" * 1000)
    disk = vmboot.job_tar(job, [data_in])
    assert len(disk) % (1 << 20) == 0
    with tarfile.open(fileobj=io.BytesIO(disk)) as t:
        assert t.getnames() == ["run", "inputs/data.bin"]
        assert t.getmember("run").mode == 0o755
        assert t.extractfile("inputs/data.bin").read() == b"\x01" * 1000  # type: ignore[union-attr]
    assert vmboot.job_tar(job, [data_in]) == disk   # the same job, the same bytes


def test_results_disk_reading(tmp_path: Path) -> None:
    disk = tmp_path / "results.img"
    disk.write_bytes(bytes(1 << 20))
    assert vmboot.read_results(disk, tmp_path / "r0") == (0, "the guest wrote no results")

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in (("./job.rc", b"0\n"), ("./sub/out.txt", b"x" * 3000)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    with open(disk, "r+b") as f:
        f.write(buf.getvalue())
    assert vmboot.read_results(disk, tmp_path / "r1") == (2, "")
    assert (tmp_path / "r1" / "sub" / "out.txt").read_bytes() == b"x" * 3000

    with open(disk, "r+b") as f:
        f.write(b"garbage!" * 64)
    n, err = vmboot.read_results(disk, tmp_path / "r2")
    assert err.startswith("results disk unreadable"), err


def test_out_dir_must_be_empty(tmp_path: Path) -> None:
    img = vmimage.Image("k", tmp_path, {}, False, 0.0)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    spec = vmboot.BootSpec(image=img, members=[vmboot.parse_member("ssd.a=64M")], job=job,
                           out=tmp_path / "out", build=build_dir())
    with pytest.raises(LabError, match="is not empty"):
        vmboot.boot(spec)


class CannotStart:
    """A Launcher whose start() fails as a domain the daemon refuses does, after
    starting a child that stands for the guest (a QEMU that got as far as that)."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.proc: subprocess.Popen[Any] | None = None
        self.closed = False

    def start(self, guest: vmboot.Guest, out: Path) -> list[bytes]:
        self.proc = vmboot.start(["sleep", "1000"], stdin=subprocess.DEVNULL)
        self.fields["qemu_command"] = "sleep 1000"
        raise LabError("libvirt: test: domain tierlab-0-boot-0 cannot start: no room\nat the inn")

    def wait(self, timeout: float) -> bool:
        raise AssertionError("wait() after a failed start")

    def kill(self) -> None:
        raise AssertionError("kill() after a failed start")

    def outcome(self, killed: bool) -> str:
        raise AssertionError("outcome() after a failed start")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            vmboot.signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
        self.closed = True


def fake_launcher_boot(launcher: Any, members: list[str], tmp_path: Path, images_dir: Path,
                       monkeypatch: pytest.MonkeyPatch, **spec_args: Any) -> tuple[Path, dict[str, Any]]:
    """One boot with real fault servers and `launcher` standing in for QEMU:
    its out directory and result."""
    tool("faultdev")
    monkeypatch.setattr(vmboot, "launcher_for", lambda spec: launcher)
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    out = tmp_path / "out"
    spec = vmboot.BootSpec(image=vmimage.Image("k", tmp_path, {}, False, 0.0),
                           members=[vmboot.parse_member(m) for m in members], job=job, out=out,
                           build=build_dir(), images_dir=images_dir, **spec_args)
    return out, vmboot.boot(spec)


def test_a_guest_that_cannot_start_is_a_failed_boot(images_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The fault servers are up when the launch fails: boot.json must still say
    # what happened, and nothing of the boot may outlive it.
    launcher = CannotStart()
    out, result = fake_launcher_boot(launcher, ["ssd.a=64M", "hdd.b=64M:hdd-fixed-10ms"], tmp_path,
                                     images_dir, monkeypatch)
    boot = json.loads((out / "boot.json").read_text())
    assert boot == result
    assert boot["status"] == "failed" and boot["job_rc"] is None
    assert boot["reason"] == "libvirt: test: domain tierlab-0-boot-0 cannot start: no room; at the inn"
    assert boot["qemu_command"] == "sleep 1000"   # the launcher's fields
    assert launcher.closed and launcher.proc is not None and launcher.proc.returncode is not None
    assert [m["serve_rc"] for m in boot["members"]] == [0, 0]   # both servers ran and were stopped
    assert not Path(boot["members"][0]["socket"]).parent.exists()   # the private directory
    assert (images_dir / "ssd.a.img").stat().st_size == 64 << 20   # member images kept
    assert "boot failed: " in vmboot.summary(boot, out)


class WillNotDie:
    """A Launcher whose guest never powers off and survives its kill (a QEMU
    stuck in the kernel): the boot is still a timeout with its times read
    from the console, and close() does not wait a second time."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.kills = 0

    def start(self, guest: vmboot.Guest, out: Path) -> list[bytes]:
        return [b"tierlab-init: start\n", b"tierlab-init: job start\n"]

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False

    def kill(self) -> None:
        self.kills += 1
        raise LabError("qemu (pid 1) did not end within 60 s of SIGKILL")

    def outcome(self, killed: bool) -> str:
        assert killed
        return ""

    def close(self) -> None:
        pass


def test_a_guest_that_survives_its_kill_is_a_timeout(images_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = WillNotDie()
    out, result = fake_launcher_boot(launcher, ["ssd.a=64M"], tmp_path, images_dir, monkeypatch,
                                     timeout=1.0)
    assert json.loads((out / "boot.json").read_text()) == result
    assert result["status"] == "timeout" and launcher.kills == 1
    assert result["reason"] == ("no poweroff within 1 s (killed); "
                                "qemu (pid 1) did not end within 60 s of SIGKILL")
    assert "job_start_s" in result["times"] and result["times"]["killed_at_s"] >= 1.0


def test_qemu_kill_that_fails_is_not_waited_for_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    q = vmboot.QemuLauncher()
    q.proc = vmboot.start(["sleep", "1000"], stdin=subprocess.DEVNULL)
    waits: list[float | None] = []

    def no_end(timeout: float | None = None) -> int:
        waits.append(timeout)
        raise subprocess.TimeoutExpired("qemu", timeout or 0)

    real_wait = q.proc.wait
    monkeypatch.setattr(q.proc, "wait", no_end)
    monkeypatch.setattr(vmboot, "signal_group", lambda p, sig: None)
    with pytest.raises(LabError, match="did not end within"):
        q.kill()
    q.close()   # no second wait
    assert waits == [vmboot.KILL_WAIT_S] and q.kill_failed
    monkeypatch.undo()
    q.proc.kill()
    real_wait()


# ------------------------------------------------------------------ real boots
# (fixtures `image` and `images_dir`: conftest.py)


def test_boot_tierfs_on_fault_members(image: vmimage.Image, images_dir: Path, tmp_path: Path) -> None:
    boot, _ = boot_tierfs_job(tmp_path, images_dir)
    assert boot["backend"] == "qemu" and boot["connect"] is None and boot["qemu_rc"] == 0
    # The command line as documented.
    cmd = boot["qemu_command"]
    for part in ("-nographic", "-no-reboot", "-net none", "-kernel", "-initrd", "driver=nbd",
                 "serial=ssd.a", "serial=hdd.b", "console=ttyS0"):
        assert part in cmd, part


def test_hung_guest_is_killed_at_its_timeout(image: vmimage.Image, images_dir: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("echo going to sleep\nsleep 100000\n")
    out = tmp_path / "boot"
    timeout = 15.0
    t0 = time.monotonic()
    # The guest's own budget is longer than the host's limit: the host must act.
    p = run([tool("tierlab"), "vm", "boot", "--member", "ssd.a=64M", "--job", job, "--out", out,
             "--images", images_dir, "--timeout", str(timeout), "--budget", "100000"], timeout=300)
    took = time.monotonic() - t0
    assert p.returncode == 1, (p.stdout, p.stderr)
    boot = json.loads((out / "boot.json").read_text())
    assert boot["status"] == "timeout", boot
    assert "no poweroff within 15 s (killed)" in boot["reason"]
    assert boot["times"]["killed_at_s"] >= timeout
    assert "to_poweroff_s" not in boot["times"]
    assert took >= timeout
    assert all(m["serve_rc"] is not None for m in boot["members"])   # servers stopped
    assert "boot timeout:" in p.stdout
    # Nothing of this boot survives: QEMU's command line names the private
    # directory (the sockets), the servers' the member images.
    private = str(Path(boot["members"][0]["socket"]).parent)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert private not in args and str(images_dir) not in args, args


@pytest.mark.parametrize("script,usable", [("exit 1", False), ("exec sleep 30", True)])
def test_kvm_is_used_only_when_qemu_starts_a_kvm_guest(script: str, usable: bool, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A host may expose /dev/kvm while QEMU aborts setting up a KVM vCPU
    # (nested virtualization: "kvm_buf_set_msrs: Assertion ... failed"):
    # auto then means TCG, not a boot that fails every time.
    try:
        open("/dev/kvm", "rb+").close()
    except OSError:
        assert not vmboot.kvm_usable()
        pytest.skip("no usable /dev/kvm here: auto is TCG without the probe")
    fake = tmp_path / "qemu"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(vmboot, "QEMU", str(fake))
    monkeypatch.setattr(vmboot, "_KVM_PROBE", {})
    assert vmboot.kvm_usable() is usable
