"""Tests of the VM lab's libvirt backend (vmlibvirt.py, `--backend libvirt`):
the domain XML against the direct backend's machine, URI checks, the console
socket, kill() against a domain that is slow to go or will not (a fake
libvirt), one-line errors for URIs it cannot use (on a host without QEMU too),
and real guests on a libvirtd of the test's own -- vmboot_test's tierfs job
booted as a domain, a domain the daemon refuses (a failed boot), and two pairs
of hung guests fanned out over two URIs, destroyed at their timeout while the
lab goes on.

The daemons (virtlogd, libvirtd) are private, and children of the test: as
root, a system-mode pair in a mount namespace of their own, with this test's
directories bound over /etc/libvirt, /run/libvirt, /var/{lib,log,cache}/libvirt
(and, on a host without libvirt-daemon-system, an /etc/passwd with the
`libvirt-qemu` user its QEMU driver insists on), listening on a socket in a
temporary directory; as any other user, a session-mode pair with XDG
directories of their own. Nothing of the host's libvirt is touched (a system
libvirtd may run beside), and only the daemons started here are stopped.
The tests that need a daemon are skipped, saying why, only where libvirtd,
python3-libvirt, QEMU or (as root) a private mount namespace cannot be had."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator

import pytest

from tierlab import LabError, vmboot, vmimage, vmlibvirt, vmpair
from tierlab.testing import assert_one_line_error, boot_tierfs_job, hung_pairs, run, tool

DAEMON_READY_S = 120.0   # the QEMU driver probes QEMU's capabilities at start (slow under load)
DAEMON_STOP_S = 30.0
LIBVIRT_DIRS = ("/etc/libvirt", "/run/libvirt", "/var/lib/libvirt", "/var/log/libvirt",
                "/var/cache/libvirt")
QEMU_USER = "libvirt-qemu"   # Debian's build-time QEMU user of a system daemon


def guest(tmp: Path, accel: str = "tcg") -> vmboot.Guest:
    disks = [vmboot.Disk("job", tmp / "job.img"), vmboot.Disk("results", tmp / "results.img"),
             vmboot.Disk("ssd.a", tmp / "ssd.a.sock", nbd=True),
             vmboot.Disk("hdd.b", tmp / "hdd.b.sock", nbd=True)]
    return vmboot.Guest(accel, 2, 1024, tmp / "vmlinux", tmp / "initramfs.cpio",
                        "console=ttyS0 panic=-1 tierlab.disks=4", disks, tmp / "console.sock")


# ------------------------------------------------------------------ without a daemon

def test_domain_is_the_command_lines_machine(tmp_path: Path) -> None:
    g = guest(tmp_path)
    text = vmlibvirt.domain_xml(g, "tierlab-1-boot-1", emulator="/usr/bin/qemu", run_as="+0:+0",
                                mac_models=["apparmor"])
    assert "<acpi/>" in text
    d = ET.fromstring(text)
    cmd = vmboot.qemu_command(g)
    assert d.get("type") == "qemu" and "tcg" in cmd
    assert d.findtext("name") == "tierlab-1-boot-1"
    assert d.find("memory").text == "1024" and d.find("memory").get("unit") == "MiB"  # type: ignore[union-attr]
    assert d.findtext("vcpu") == "2"
    assert d.find("os/type").get("machine") == "q35"  # type: ignore[union-attr]
    assert d.findtext("os/kernel") == cmd[cmd.index("-kernel") + 1]
    assert d.findtext("os/initrd") == cmd[cmd.index("-initrd") + 1]
    assert d.findtext("os/cmdline") == cmd[cmd.index("-append") + 1]
    assert d.find("features/acpi") is not None
    assert d.find("cpu").get("mode") == "maximum" and cmd[cmd.index("-cpu") + 1] == "max"  # type: ignore[union-attr]
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        assert d.findtext(event) == "destroy"
    assert d.find("devices/interface") is None   # no network, as -net none
    disks = d.findall("devices/disk")
    assert [x.findtext("serial") for x in disks] == [x.serial for x in g.disks]
    assert [x.find("target").get("bus") for x in disks] == ["virtio"] * 4  # type: ignore[union-attr]
    assert [x.find("source").get("file") for x in disks[:2]] == [str(tmp_path / "job.img"),  # type: ignore[union-attr]
                                                                  str(tmp_path / "results.img")]
    for x, label in zip(disks[2:], ("ssd.a", "hdd.b")):
        assert x.get("type") == "network" and x.find("driver").get("cache") == "none"  # type: ignore[union-attr]
        host = x.find("source[@protocol='nbd']/host")
        assert host is not None and host.get("transport") == "unix"
        assert host.get("socket") == str(tmp_path / f"{label}.sock")
        assert f"server.path={tmp_path / f'{label}.sock'},cache.direct=on" in " ".join(cmd)
    serial = d.find("devices/serial")   # QEMU connects to our socket: no virtlogd, no file
    assert serial is not None and serial.get("type") == "unix"
    source = serial.find("source")
    assert source is not None and source.attrib == {"mode": "connect",
                                                    "path": str(tmp_path / "console.sock")}
    labels = {x.get("model"): x for x in d.findall("seclabel")}
    assert labels["dac"].get("type") == "static" and labels["dac"].get("relabel") == "no"
    assert labels["dac"].findtext("label") == "+0:+0"
    assert labels["apparmor"].get("type") == "none"

    kvm = ET.fromstring(vmlibvirt.domain_xml(guest(tmp_path, "kvm"), "n", emulator="q", run_as=None,
                                             mac_models=[]))
    assert kvm.get("type") == "kvm" and kvm.find("cpu").get("mode") == "host-passthrough"  # type: ignore[union-attr]
    assert kvm.find("seclabel") is None   # a session daemon: QEMU is its own user


@pytest.mark.parametrize("uri", ["qemu+ssh://lab2/system", "qemu+tcp://lab2/system",
                                 "qemu://lab2/system", "xen:///system", "qemu:///embed?root=/x",
                                 "test:///default"])
def test_only_local_qemu_uris(uri: str) -> None:
    with pytest.raises(LabError, match="is not a local QEMU URI"):
        vmlibvirt.check_local(uri)


@pytest.mark.parametrize("uri", ["qemu:///system", "qemu:///session", "qemu+unix:///system",
                                 "qemu:///system?socket=/tmp/x/libvirt-sock"])
def test_local_uris(uri: str) -> None:
    vmlibvirt.check_local(uri)


def test_console_socket_loses_nothing_written_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "console.sock"
    console = vmlibvirt.ConsoleSocket(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # QEMU connects as it starts and the guest writes at once, before the host
    # reads: more than a socket holds, and more than virtlogd's 2 MiB rotation.
    lines = [b"%07d %s\n" % (i, b"x" * 56) for i in range(48 << 10)]   # 3 MiB
    qemu = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    qemu.connect(str(path))

    def guest() -> None:
        qemu.sendall(b"".join(lines) + b"one\ntw")   # blocks until the host reads
        time.sleep(0.1)
        qemu.sendall(b"o\nno newline")
        qemu.close()
    t = threading.Thread(target=guest)
    t.start()
    time.sleep(0.3)
    assert console.accept(5)
    got = list(console.lines())
    t.join()
    assert got == lines + [b"one\n", b"two\n", b"no newline"]
    console.close()
    console.close()   # idempotent


def test_console_socket_no_qemu_and_close(tmp_path: Path) -> None:
    lonely = vmlibvirt.ConsoleSocket(tmp_path / "a.sock")
    t0 = time.monotonic()
    assert not lonely.accept(0.2)   # nobody connected
    assert time.monotonic() - t0 < 2
    lonely.close()
    # close() ends a reader waiting for a line (a QEMU that never closes its end).
    console = vmlibvirt.ConsoleSocket(tmp_path / "b.sock")
    qemu = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    qemu.connect(str(tmp_path / "b.sock"))
    assert console.accept(5)
    qemu.sendall(b"partial")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(console.lines()))
    reader.start()
    time.sleep(0.2)
    console.close()
    reader.join(timeout=5)
    assert not reader.is_alive() and got in ([], [b"partial"])
    qemu.close()
    with pytest.raises(LabError, match="console socket"):
        vmlibvirt.ConsoleSocket(tmp_path / "no-such-dir" / "c.sock")


# ------------------------------------------------------------------ kill() on a fake libvirt

class FakeError(Exception):
    def __init__(self, text: str, code: int = 1) -> None:
        super().__init__(text)
        self.code = code

    def get_error_code(self) -> int:
        return self.code

    def get_error_message(self) -> str:
        return str(self)


NO_DOMAIN = 42
FAKE_LV = types.SimpleNamespace(
    libvirtError=FakeError, VIR_ERR_NO_DOMAIN=NO_DOMAIN, VIR_DOMAIN_EVENT_ID_LIFECYCLE=0,
    VIR_DOMAIN_EVENT_STOPPED=5,
    **{f"VIR_DOMAIN_EVENT_STOPPED_{d}": i for i, d in enumerate(vmlibvirt.STOP_DETAILS)})


class FakeConn:
    def __init__(self) -> None:
        self.lifecycle: Any = None

    def getURI(self) -> str:
        return "qemu:///session"

    def domainEventRegisterAny(self, dom: Any, event: int, callback: Any, opaque: Any) -> int:
        self.lifecycle = callback
        return 1

    def registerCloseCallback(self, callback: Any, opaque: Any) -> None:
        pass

    def domainEventDeregisterAny(self, callback_id: int) -> None:
        pass

    def unregisterCloseCallback(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeDomain:
    """A running domain whose destroy fails `failures` times (libvirt's "cannot
    acquire state change lock"; None: always), then ends it: the domain is gone
    at once, its stop event comes `event_after` s later."""

    def __init__(self, launcher: vmlibvirt.LibvirtLauncher, conn: FakeConn, failures: int | None,
                 event_after: float = 0.0) -> None:
        self.launcher, self.conn = launcher, conn
        self.failures, self.event_after = failures, event_after
        self.active, self.destroys = True, 0

    def name(self) -> str:
        return self.launcher.name

    def destroy(self) -> None:
        self.destroys += 1
        if self.failures is None or self.destroys <= self.failures:
            raise FakeError("Timed out during operation: cannot acquire state change lock")
        self.active = False
        event = threading.Timer(self.event_after, self.conn.lifecycle,
                                (self.conn, self, FAKE_LV.VIR_DOMAIN_EVENT_STOPPED,
                                 FAKE_LV.VIR_DOMAIN_EVENT_STOPPED_DESTROYED, None))
        event.daemon = True
        event.start()

    def isActive(self) -> bool:
        if not self.active:
            raise FakeError("Domain not found", NO_DOMAIN)   # a transient domain that stopped
        return True


def fake_launcher(monkeypatch: pytest.MonkeyPatch, failures: int | None,
                  event_after: float = 0.0) -> tuple[vmlibvirt.LibvirtLauncher, FakeDomain]:
    conn = FakeConn()
    monkeypatch.setattr(vmlibvirt, "_libvirt", lambda: FAKE_LV)
    monkeypatch.setattr(vmlibvirt, "connect", lambda uri: conn)
    monkeypatch.setattr(vmlibvirt, "KILL_WAIT_S", 3.0)
    monkeypatch.setattr(vmlibvirt, "KILL_RETRY_S", 0.1)
    monkeypatch.setattr(vmlibvirt, "EVENT_GRACE_S", 0.2)
    launcher = vmlibvirt.LibvirtLauncher("qemu:///session")
    launcher.dom = FakeDomain(launcher, conn, failures, event_after)
    return launcher, launcher.dom


def test_kill_returns_only_once_the_domain_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # destroy fails twice before it ends the domain: kill() must try again,
    # not return while the domain (its QEMU, the NBD disks' client) still runs.
    launcher, dom = fake_launcher(monkeypatch, failures=2)
    launcher.kill()
    assert not dom.active and dom.destroys == 3
    assert launcher.outcome(killed=True).startswith("the domain stopped (destroyed)")
    assert launcher.fields["end_state"] == {"state": "shutoff", "reason": "destroyed"}
    launcher.close()
    # Gone at once, its event late: the poll of the domain tells.
    launcher, dom = fake_launcher(monkeypatch, failures=0, event_after=10.0)
    t0 = time.monotonic()
    launcher.kill()
    assert not dom.active and time.monotonic() - t0 < 2.0
    assert launcher.outcome(killed=True).startswith("the domain stopped (destroyed)")
    launcher.close()


def test_kill_says_when_the_domain_does_not_end(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher, dom = fake_launcher(monkeypatch, failures=None)
    t0 = time.monotonic()
    with pytest.raises(LabError, match=rf"libvirt: qemu:///session: domain {launcher.name} did not "
                       r"end within 3 s of tierlab's destroy \(libvirt: Timed out during operation: "
                       r"cannot acquire state change lock\)"):
        launcher.kill()
    assert 3.0 <= time.monotonic() - t0 < 6.0
    assert dom.active and dom.destroys > 3   # tried again meanwhile
    assert launcher.fields["end_state"]["state"] == "unknown"
    n = dom.destroys
    launcher.close()   # no second wait; closing the connection is libvirt's auto-destroy
    assert dom.destroys == n


def test_pairs_fan_out_over_the_uris() -> None:
    vm = vmpair.VmSettings(1, 1536, 100.0, "tcg", None, "libvirt", ("a", "b", "c"))
    assert [vm.uri(i) for i in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]
    assert vmpair.VmSettings(1, 1536, 100.0, "tcg").uri(3) is None


def no_qemu(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no qemu-system-x86_64 (nor anything else):
    the command-line checks must not need QEMU."""
    (tmp_path / "empty-bin").mkdir()
    return dict(os.environ, PATH=str(tmp_path / "empty-bin"))


@pytest.mark.parametrize("extra,needle,needs_libvirt", [
    (["--backend", "libvirt", "--connect", "qemu+ssh://lab2/system"],
     "libvirt: qemu+ssh://lab2/system is not a local QEMU URI", False),
    (["--backend", "libvirt", "--connect", "qemu:///system?socket=/nonexistent/libvirt-sock"],
     "libvirt: cannot connect to qemu:///system?socket=/nonexistent/libvirt-sock: ", True),
    (["--connect", "qemu:///system"], "--connect is for --backend libvirt", False),
    (["--backend", "libvirt", "--connect", "qemu:///system", "--connect", "qemu:///session"],
     "one guest, one --connect URI", False),
])
def test_boot_mistakes(extra: list[str], needle: str, needs_libvirt: bool, tmp_path: Path) -> None:
    if needs_libvirt:   # to try the connection
        pytest.importorskip("libvirt", reason="python3-libvirt is not installed (scripts/install-deps lab)")
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    p = run([tool("tierlab"), "vm", "boot", "--member", "ssd.a=64M", "--job", job,
             "--out", tmp_path / "out", *extra], env=no_qemu(tmp_path))
    assert_one_line_error(p, 2, "tierlab vm boot: ", needle)
    assert not (tmp_path / "out").exists()


def test_pair_with_an_unusable_uri(tmp_path: Path) -> None:
    p = run([tool("tierlab"), "vm", "pair", "--profile", "labtest", "--pairs", "2", "--out",
             tmp_path / "o", "--backend", "libvirt", "--connect", "qemu+ssh://lab2/system"],
            env=no_qemu(tmp_path))
    assert_one_line_error(p, 2, "tierlab vm pair: libvirt: qemu+ssh://lab2/system is not a local")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ a daemon of our own

class Daemons:
    """virtlogd and libvirtd as children of the test (not daemonized: they are
    ours to stop and to reap), logging into `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.made: list[Path] = []   # mount points made for the system pair, removed after

    def spawn(self, cmd: list[str], name: str, **kw: Any) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.out", "wb") as log:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def wait_for(self, path: Path, name: str, proc: subprocess.Popen[bytes]) -> None:
        end = time.monotonic() + DAEMON_READY_S
        while not path.exists():
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"{name}: no {path}: "
                            + (self.root / f"{name}.out").read_text(errors="replace")[-2000:])
            time.sleep(0.1)

    def system(self) -> str:
        """System mode, in a mount namespace of their own. Returns the URI."""
        if shutil.which("unshare") is None or shutil.which("nsenter") is None:
            pytest.skip("unshare/nsenter (util-linux) missing: no private mount namespace for libvirtd")
        root = self.root
        for d in map(Path, LIBVIRT_DIRS):
            if not d.exists():
                d.mkdir(parents=True)
                self.made.append(d)
        for sub in ("etc", "run", "lib", "log", "cache", "sock"):
            (root / sub).mkdir()
        (root / "etc" / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{root}/sock"\nunix_sock_rw_perms = "0700"\nauth_unix_rw = "none"\n'
            f'log_outputs = "3:file:{root}/libvirtd.log"\n')
        (root / "etc" / "virtlogd.conf").write_text(f'log_outputs = "3:file:{root}/virtlogd.log"\n')
        binds = [(root / "etc", "/etc/libvirt"), (root / "run", "/run/libvirt"),
                 (root / "lib", "/var/lib/libvirt"), (root / "log", "/var/log/libvirt"),
                 (root / "cache", "/var/cache/libvirt")]
        if subprocess.run(["getent", "passwd", QEMU_USER], capture_output=True).returncode != 0:
            # What libvirt-daemon-system's postinst would add; only this namespace sees it.
            (root / "passwd").write_text(Path("/etc/passwd").read_text()
                                         + f"{QEMU_USER}:x:64055:64055::/nonexistent:/usr/sbin/nologin\n")
            (root / "group").write_text(Path("/etc/group").read_text() + f"{QEMU_USER}:x:64055:\n")
            binds += [(root / "passwd", "/etc/passwd"), (root / "group", "/etc/group")]
        # The pid files away from the host's /run (a system libvirtd may run there).
        script = ["set -e", *[f"mount --bind '{src}' '{dst}'" for src, dst in binds],
                  f"exec virtlogd -p '{root}/virtlogd.pid' -f '{root}/etc/virtlogd.conf'"]
        logd = self.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           "\n".join(script)], "virtlogd")
        end = time.monotonic() + 30
        while not (root / "run" / "virtlogd-sock").exists():
            if logd.poll() is not None or time.monotonic() > end:
                out = (root / "virtlogd.out").read_text(errors="replace").strip()
                if logd.poll() is not None and "mount" in out:
                    pytest.skip(f"no private mount namespace for libvirtd: {out[-300:]}")
                pytest.fail(f"virtlogd did not start: {out[-2000:]}")
            time.sleep(0.1)
        libvirtd = self.spawn(["nsenter", f"--mount=/proc/{logd.pid}/ns/mnt", "--",
                               "libvirtd", "-p", f"{root}/libvirtd.pid", "-f", f"{root}/etc/libvirtd.conf"],
                              "libvirtd")
        self.wait_for(root / "sock" / "libvirt-sock", "libvirtd", libvirtd)
        return f"qemu:///system?socket={root}/sock/libvirt-sock"

    def session(self) -> str:
        """Session mode with XDG directories of their own. Returns the URI."""
        root = self.root
        env = dict(os.environ, XDG_CONFIG_HOME=str(root / "config"), XDG_CACHE_HOME=str(root / "cache"),
                   XDG_RUNTIME_DIR=str(root / "run"), XDG_DATA_HOME=str(root / "data"))
        (root / "config" / "libvirt").mkdir(parents=True)
        (root / "run").mkdir(mode=0o700)
        (root / "config" / "libvirt" / "libvirtd.conf").write_text(
            f'log_outputs = "3:file:{root}/libvirtd.log"\n')
        self.wait_for(root / "run" / "libvirt" / "virtlogd-sock", "virtlogd",
                      self.spawn(["virtlogd", "-p", str(root / "virtlogd.pid")], "virtlogd", env=env))
        libvirtd = self.spawn(["libvirtd", "-p", str(root / "libvirtd.pid")], "libvirtd", env=env)
        self.wait_for(root / "run" / "libvirt" / "libvirt-sock", "libvirtd", libvirtd)
        return f"qemu:///session?socket={root}/run/libvirt/libvirt-sock"

    def stop(self) -> None:
        """libvirtd, then virtlogd: TERM, then KILL; then the mount points."""
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=DAEMON_STOP_S)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        for d in reversed(self.made):
            try:
                d.rmdir()
            except OSError:
                pass


@pytest.fixture(scope="module")
def daemon() -> Iterator[str]:
    """The URI of a libvirtd of this module's own (see the top of the file)."""
    for prog in ("libvirtd", "virtlogd"):
        if shutil.which(prog) is None:
            pytest.skip(f"{prog} is not installed (scripts/install-deps lab)")
    pytest.importorskip("libvirt", reason="python3-libvirt is not installed (scripts/install-deps lab)")
    root = Path(tempfile.mkdtemp(prefix="tierlab-libvirtd-"))
    daemons = Daemons(root)
    try:
        uri = daemons.system() if os.geteuid() == 0 else daemons.session()
        end = time.monotonic() + DAEMON_READY_S
        while True:
            try:
                vmlibvirt.check(uri)   # the QEMU driver answers once it has probed QEMU
                break
            except LabError as e:
                if time.monotonic() > end:
                    log = root / "libvirtd.log"
                    pytest.fail(f"the test's libvirtd does not answer: {e}\n"
                                + (log.read_text()[-3000:] if log.exists() else ""))
            time.sleep(0.5)
        yield uri
    finally:
        daemons.stop()
        shutil.rmtree(root, ignore_errors=True)


def domains(uri: str) -> list[str]:
    conn = vmlibvirt.connect(uri)
    try:
        return [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


def test_boot_as_a_libvirt_domain(daemon: str, image: vmimage.Image, images_dir: Path,
                                  tmp_path: Path) -> None:
    boot, out = boot_tierfs_job(tmp_path, images_dir, "--backend", "libvirt", "--connect", daemon)
    assert boot["backend"] == "libvirt" and boot["connect"] == daemon
    assert boot["end_state"] == {"state": "shutoff", "reason": "shutdown"}
    assert "qemu_rc" not in boot and "qemu_command" not in boot
    assert boot["domain"].startswith("tierlab-") and boot["domain"] not in domains(daemon)
    xml = (out / "domain.xml").read_text()
    assert boot["domain_xml"] == str(out / "domain.xml") and "<acpi/>" in xml
    d = ET.fromstring(xml)
    assert d.findtext("name") == boot["domain"] and d.findtext("os/kernel") == str(image.vmlinux)
    # The console socket kept the guest's last words (virtlogd's file could lose them).
    tail = (out / "console.log").read_text().splitlines()[-3:]
    assert any(line.endswith("reboot: Power down") for line in tail), tail


def test_a_domain_the_daemon_refuses_is_a_failed_boot(daemon: str, image: vmimage.Image,
                                                       images_dir: Path, tmp_path: Path) -> None:
    # More vCPUs than q35 has: createXML fails after the fault servers started.
    job = tmp_path / "job.sh"
    job.write_text("true\n")
    out = tmp_path / "boot"
    p = run([tool("tierlab"), "vm", "boot", "--member", "ssd.a=64M", "--job", job, "--out", out,
             "--images", images_dir, "--cpus", "5000", "--timeout", "60",
             "--backend", "libvirt", "--connect", daemon], timeout=300)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "boot failed: " in p.stdout and p.stderr == ""
    boot = json.loads((out / "boot.json").read_text())
    assert boot["status"] == "failed", boot
    assert boot["reason"].startswith(f"libvirt: {daemon}: domain {boot['domain']} cannot start: "), boot
    assert "\n" not in boot["reason"]
    assert boot["members"][0]["serve_rc"] is not None   # the server was stopped
    private = str(Path(boot["members"][0]["socket"]).parent)
    assert not Path(private).exists()
    assert boot["domain"] not in domains(daemon)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert private not in args and str(images_dir) not in args, args


def test_hung_pairs_fan_out_and_are_destroyed(daemon: str, image: vmimage.Image,
                                              tmp_path: Path) -> None:
    # Two URIs of the same daemon stand for two hosts.
    uris = [daemon, daemon.replace("qemu://", "qemu+unix://", 1)]
    out = tmp_path / "lab"
    _, runs = hung_pairs(out, "--backend", "libvirt", "--connect", uris[0], "--connect", uris[1],
                         "--no-report")
    meta = json.loads((out / "lab.json").read_text())
    assert meta["vm"]["backend"] == "libvirt" and meta["vm"]["connect"] == uris
    for rel, info in zip(meta["runs"], runs):
        assert info["boot"]["backend"] == "libvirt"
        assert info["boot"]["connect"] == uris[info["pair"] % 2]   # both slots of a pair on one
        boot = json.loads((out / rel / "boot" / "boot.json").read_text())
        assert boot["end_state"] == {"state": "shutoff", "reason": "destroyed"}, boot
        assert boot["times"]["killed_at_s"] >= 12
        assert (out / rel / "boot" / "domain.xml").is_file()
    assert [n for n in domains(daemon) if n.startswith("tierlab-")] == []
