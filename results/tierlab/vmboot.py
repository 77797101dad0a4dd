"""One VM lab boot: a QEMU guest whose member disks are fault devices over NBD,
running one job and leaving its results (docs/lab/vmlab.md).

    result = vmboot.boot(vmboot.BootSpec(image=..., members=[...], job=..., out=...))

Per boot: every member image is served by its own `faultdev serve` (nbdkit, a
unix socket in a private directory under /dev/shm) and attached as an NBD
virtio disk with serial LABEL; a `job` disk (a tar holding `run` and the
inputs) and a `results` disk (zeros; the guest writes a tar onto it) are plain
files. The guest's serial console is read line by line and written to
OUT/console.log with the host's time since launch on each line; the init's
marker lines give the wall times, and a job may print its own
(`tierlab-mark: NAME`). Fault events go to the member's control socket at
their time after the job starts, or after a job's marker.

Only the launch, the wait and the kill of the guest differ between backends
(a Launcher): QemuLauncher runs qemu-system-x86_64 as our child and reads the
console from its stdout; vmlibvirt.LibvirtLauncher starts the same machine as
a transient libvirt domain. Everything else here is shared.

Invariants: the boot never outlives its hard timeout -- the guest is killed
(QEMU's process group, or the domain destroyed), then its NBD servers (TERM,
then KILL), and only those: every child is started in its own session and
killed by its own group id. Whatever happens (timeout, a dead server, a guest
that cannot start, Ctrl-C), the children are gone and, except for Ctrl-C,
OUT/boot.json says what happened: from the first fault server's start on, a
LabError is a failed boot with its one line as the reason.
Member images are kept (the caller checks them); the private directory is
removed."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

from tierlab import LabError
from tierlab import profile as profile_mod
from tierlab.vmimage import Image

QEMU = "qemu-system-x86_64"
SERVE_READY_S = 30.0      # faultdev serve: socket up within this
SERVER_STOP_S = 10.0      # after SIGTERM, before SIGKILL
KILL_WAIT_S = 60.0        # a killed guest (QEMU, or a libvirt domain) must be gone within this
CTL_TIMEOUT_S = 20.0
RESULTS_DISK = 256 << 20
SERIAL_MAX = 20           # virtio-blk's serial field (VIRTIO_BLK_ID_BYTES)
CTL_COMMANDS = ("stall", "unstall", "error", "clear", "powercut", "poweron", "clear-errors", "stats")
LABEL_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+")


@dataclass
class Member:
    label: str
    size: int
    profile: str | None          # faultdev profile name or path; None: passthrough

    @property
    def serve_profile(self) -> str:
        return self.profile or "passthrough"


@dataclass
class Event:
    at_s: float                  # seconds after the job starts
    label: str
    command: list[str]


def fault_profile(name: str) -> str:
    """A faultdev profile name (faultdevices/profiles/NAME.toml) or a file; checked."""
    if "/" in name or name.endswith(".toml"):
        p = Path(name)
        if not p.is_file():
            raise LabError(f"fault profile file {name} does not exist")
        return str(p.resolve())
    if not (profile_mod.FAULT_PROFILES_DIR / f"{name}.toml").is_file():
        known = sorted(p.stem for p in profile_mod.FAULT_PROFILES_DIR.glob("*.toml"))
        raise LabError(f"unknown fault profile '{name}' (known: {', '.join(known)})")
    return name


def parse_member(text: str) -> Member:
    """LABEL=SIZE[:FAULTPROFILE], e.g. ssd.a=1G or hdd.b=2GiB:hdd-fixed-10ms."""
    label, eq, rest = text.partition("=")
    if not eq or not label or not rest:
        raise LabError(f"bad member '{text}': want LABEL=SIZE[:FAULTPROFILE] (e.g. hdd.b=2G:hdd-7200)")
    if not LABEL_RE.fullmatch(label):
        raise LabError(f"bad member label '{label}': want GROUP.NAME (e.g. ssd.a)")
    if len(label) > SERIAL_MAX:
        raise LabError(f"member label '{label}' is longer than {SERIAL_MAX} bytes (the virtio serial)")
    size_text, _, prof = rest.partition(":")
    size = profile_mod.parse_size(size_text, f"member {label}")
    if size < 1 << 20 or size % (1 << 20):
        raise LabError(f"member {label}: size must be a whole number of MiB, at least 1MiB (got {size_text})")
    return Member(label, size, fault_profile(prof) if prof else None)


def parse_event(text: str, labels: list[str]) -> Event:
    """T:LABEL:COMMAND, e.g. 30:hdd.b:stall 10 (T in seconds after the job starts)."""
    parts = text.split(":", 2)
    if len(parts) != 3 or not parts[2].strip():
        raise LabError(f"bad event '{text}': want T:LABEL:COMMAND (e.g. 30:hdd.b:stall 10)")
    at = profile_mod.parse_duration_s(parts[0], f"event '{text}'")
    if parts[1] not in labels:
        raise LabError(f"event '{text}' names no member (members: {', '.join(labels)})")
    cmd = parts[2].split()
    if cmd[0] not in CTL_COMMANDS:
        raise LabError(f"event '{text}': unknown command '{cmd[0]}' (one of {', '.join(CTL_COMMANDS)})")
    return Event(at, parts[1], cmd)


_KVM_PROBE: dict[str, bool] = {}


def kvm_usable() -> bool:
    """Whether guests can use KVM: /dev/kvm opens *and* QEMU starts a KVM
    vCPU of the machine guests use. The second is probed once per process:
    some hosts (nested virtualization) expose /dev/kvm but QEMU aborts
    setting the vCPU's MSRs ("kvm_buf_set_msrs: Assertion ... failed"),
    and every boot failed there; those fall back to TCG, as a host without
    /dev/kvm does. The probe runs the machine with no boot device (the
    firmware waits) and calls it usable if it is still up after 2 s."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    if "kvm" not in _KVM_PROBE:
        _KVM_PROBE["kvm"] = _qemu_kvm_starts()
    return _KVM_PROBE["kvm"]


def _qemu_kvm_starts() -> bool:
    cmd = [QEMU, "-machine", "q35", "-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "64",
           "-nodefaults", "-display", "none", "-monitor", "none", "-serial", "none", "-net", "none"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return False
    try:
        proc.wait(timeout=2.0)
        return False  # (it ended by itself: it could not run)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def job_tar(job: Path, inputs: list[Path]) -> bytes:
    """The job disk's contents: a tar of `run` and inputs/NAME, padded to 1 MiB.
    Fixed owner and mtime: the same job gives the same disk."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        def add(name: str, data: bytes, mode: int) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            t.addfile(info, io.BytesIO(data))
        try:
            add("run", job.read_bytes(), 0o755)
            for p in inputs:
                add(f"inputs/{p.name}", p.read_bytes(), 0o755 if os.access(p, os.X_OK) else 0o644)
        except OSError as e:
            raise LabError(f"{e.filename}: cannot read ({e.strerror})") from None
    data = buf.getvalue()
    return data + b"\0" * (-len(data) % (1 << 20))


def read_results(disk: Path, dest: Path) -> tuple[int, str]:
    """Unpack the tar the guest wrote at the start of `disk` into `dest`: regular
    files and directories only, no absolute or escaping names. Returns (files,
    error); error is "" when the tar was read to its end."""
    with open(disk, "rb") as f:
        if f.read(512) == b"\0" * 512:
            return 0, "the guest wrote no results"
        f.seek(0)
        n = 0
        try:
            with tarfile.open(fileobj=f, mode="r:") as t:
                for m in t:
                    name = os.path.normpath(m.name)
                    if name == ".":
                        continue
                    if name.startswith(("/", "..")):
                        return n, f"results: refusing member name {m.name!r}"
                    target = dest / name
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                    elif m.isreg():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        src = t.extractfile(m)
                        assert src is not None
                        with open(target, "wb") as out:
                            shutil.copyfileobj(src, out)
                        n += 1
        except (tarfile.TarError, EOFError, OSError) as e:
            return n, f"results disk unreadable: {e}"
    return n, ""


# ------------------------------------------------------------------ children

def start(cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(cmd, start_new_session=True, **kw)


def signal_group(p: subprocess.Popen[Any], sig: int) -> None:
    """Signal the child's own process group (it leads its session). The group id
    stays reserved while the leader is unreaped, so this never hits a stranger."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(p: subprocess.Popen[Any], grace: float) -> int | None:
    """TERM, wait `grace`, then KILL. Returns the exit status."""
    if p.poll() is None:
        signal_group(p, signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    signal_group(p, signal.SIGKILL)
    try:
        return p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


# ------------------------------------------------------------------ the boot

@dataclass
class BootSpec:
    image: Image
    members: list[Member]
    job: Path
    out: Path
    build: Path                          # for faultdev (build/bin/faultdev)
    inputs: list[Path] = field(default_factory=list)
    images_dir: Path | None = None       # member images; default: new dir under /dev/shm
    timeout: float = 600.0               # hard wall limit of the whole boot
    budget: float | None = None          # the job's limit inside the guest
    cpus: int = 2
    mem_mib: int = 1024
    events: list[Event] = field(default_factory=list)
    fault_sets: dict[str, list[str]] = field(default_factory=dict)   # label -> faultdev --set
    seed: int = 1
    accel: str = "auto"                  # auto | kvm | tcg
    shm: Path = Path("/dev/shm")
    events_after: str | None = None      # time events from `tierlab-mark: NAME`, not the job start
    cancel: threading.Event | None = None   # set by another thread: kill the guest now (Ctrl-C)
    backend: str = "qemu"                # qemu (QEMU as our child) | libvirt (a transient domain)
    connect: str | None = None           # libvirt: the URI (default vmlibvirt.DEFAULT_URI)

    def job_budget(self) -> float:
        if self.budget is not None:
            return self.budget
        return max(self.timeout - 60.0, self.timeout / 2)


class Console:
    """Reads the serial console (QEMU's stdout, or the libvirt domain's console
    socket) line by line into console.log, each line stamped with seconds since
    launch, and notes the init's markers."""

    MARKERS = {"tierlab-init: start": "to_init_s", "tierlab-init: job start": "job_start_s",
               "tierlab-init: results written": "results_written_s"}
    JOB_MARK = "tierlab-mark: "   # a job's own marker: times["mark_NAME"]

    def __init__(self, stream: Iterable[bytes], log: Path, t0: float) -> None:
        self.stream, self.log_path, self.t0 = stream, log, t0
        self.times: dict[str, float] = {}
        self.job_rc_line: str = ""
        self.panic: str = ""
        self.job_started = threading.Event()
        self.marked = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.log_path, "w", buffering=1) as log:
            for raw in self.stream:
                now = time.monotonic() - self.t0
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n").replace("\r", "")
                line = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line)   # SeaBIOS's screen codes
                log.write(f"[{now:8.3f}] {line}\n")
                for marker, key in self.MARKERS.items():
                    # "in": the first marker shares its line with SeaBIOS's last words.
                    if marker in line and key not in self.times:
                        self.times[key] = round(now, 3)
                        if key == "job_start_s":
                            self.job_started.set()
                if line.startswith(self.JOB_MARK):
                    key = "mark_" + line[len(self.JOB_MARK):].strip()
                    with self.marked:
                        self.times.setdefault(key, round(now, 3))
                        self.marked.notify_all()
                if line.startswith("tierlab-init: job end"):
                    self.times.setdefault("job_end_s", round(now, 3))
                if "Kernel panic" in line and not self.panic:
                    self.panic = line.split("]", 1)[-1].strip()[:200]


@dataclass
class Disk:
    serial: str                  # the guest's /dev/lab/SERIAL
    path: Path                   # a raw image file, or an NBD server's unix socket
    nbd: bool = False


@dataclass
class Guest:
    """The machine every backend boots: q35, the accelerator's CPU model, no
    network, the kernel and initramfs booted directly, virtio disks in order,
    the serial console as ttyS0."""
    accel: str                   # kvm | tcg
    cpus: int
    mem_mib: int
    kernel: Path
    initrd: Path
    cmdline: str
    disks: list[Disk]
    console: Path                # a backend that cannot hand us a pipe: the console's unix socket


def kernel_cmdline(spec: BootSpec, ndisks: int) -> str:
    return (f"console=ttyS0 loglevel=4 panic=-1 tierlab.budget={int(spec.job_budget())} "
            f"tierlab.disks={ndisks}")


def qemu_command(guest: Guest) -> list[str]:
    cmd = [QEMU, "-machine", "q35", "-accel", guest.accel,
           "-cpu", "host" if guest.accel == "kvm" else "max",
           "-smp", str(guest.cpus), "-m", str(guest.mem_mib),
           "-nographic", "-no-reboot", "-net", "none",
           "-kernel", str(guest.kernel), "-initrd", str(guest.initrd), "-append", guest.cmdline]
    for i, d in enumerate(guest.disks):
        node = f"d{i}"
        opts = (["driver=nbd", "server.type=unix", f"server.path={d.path}", "cache.direct=on"]
                if d.nbd else ["driver=file", f"filename={d.path}"])
        cmd += ["-blockdev", ",".join([*opts, f"node-name={node}"]),
                "-device", f"virtio-blk-pci,drive={node},serial={d.serial}"]
    return cmd


class Launcher(Protocol):
    """Starts, waits for and kills one guest; boot() does the rest. Used by one
    thread (the boot's), except that start's console stream is read by another."""

    fields: dict[str, Any]       # for boot.json: how the guest was launched and how it ended

    def start(self, guest: Guest, out: Path) -> Iterable[bytes]:
        """Launch; returns the serial console's lines as they come (they end
        some time after the guest does). A LabError when it cannot start
        (boot() makes that a failed boot and calls close())."""
        ...

    def wait(self, timeout: float) -> bool:
        """Up to `timeout` s for the guest to end; whether it has."""
        ...

    def kill(self) -> None:
        """End this guest now (only this one); returns once it has ended, or
        raises a LabError saying it could not (the boot fails with it)."""
        ...

    def outcome(self, killed: bool) -> str:
        """After the guest ended (killed by kill() or not): record how in
        `fields`; "" when it powered off by itself, else why not (ignored when
        killed)."""
        ...

    def close(self) -> None:
        """Kill the guest if it runs and free what the launcher holds; idempotent."""
        ...


class QemuLauncher:
    """QEMU as our child, in its own session: the console is its stdout."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.proc: subprocess.Popen[Any] | None = None
        self.stderr_path: Path | None = None
        self.kill_failed = False   # kill() gave up: close() does not wait again

    def start(self, guest: Guest, out: Path) -> Iterable[bytes]:
        cmd = qemu_command(guest)
        self.fields["qemu_command"] = shlex.join(cmd)
        self.stderr_path = out / "qemu.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = start(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
        assert self.proc.stdout is not None
        return self.proc.stdout

    def wait(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None and not self.kill_failed:
            signal_group(self.proc, signal.SIGKILL)
            try:
                self.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self.kill_failed = True
                raise LabError(f"qemu (pid {self.proc.pid}) did not end within {KILL_WAIT_S:g} s "
                               "of SIGKILL") from None

    def outcome(self, killed: bool) -> str:
        assert self.proc is not None and self.stderr_path is not None
        rc = self.fields["qemu_rc"] = None if killed else self.proc.returncode
        self.fields["qemu_stderr"] = last_line(self.stderr_path)
        return "" if rc == 0 else f"qemu exited with status {rc}: {self.fields['qemu_stderr']}"

    def close(self) -> None:
        try:
            self.kill()
        except LabError:
            pass  # said by the boot's own kill(); nothing more to do here


def launcher_for(spec: BootSpec) -> Launcher:
    """The backend's launcher; libvirt's connects here, so that a URI it cannot
    reach is a mistake before anything starts. Both run qemu-system-x86_64."""
    if shutil.which(QEMU) is None:
        raise LabError(f"{QEMU} is not installed: run scripts/install-deps lab")
    if spec.backend == "qemu":
        return QemuLauncher()
    if spec.backend == "libvirt":
        from tierlab import vmlibvirt
        return vmlibvirt.LibvirtLauncher(spec.connect or vmlibvirt.DEFAULT_URI)
    raise LabError(f"unknown backend '{spec.backend}' (qemu or libvirt)")


def member_image(path: Path, size: int) -> None:
    """A member image of `size` bytes (sparse when new); an existing one must match."""
    if path.exists():
        have = path.stat().st_size
        if have != size:
            raise LabError(f"member image {path} exists with {have} bytes, want {size}")
        return
    with open(path, "wb") as f:
        f.truncate(size)


def listening(path: Path) -> bool:
    """Whether a unix socket at `path` is listening (/proc/net/unix: Flags has
    __SO_ACCEPTCON, 0x10000). Read rather than connected to: a probe connection
    would make nbdkit log a failed handshake."""
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[7] == str(path) and int(parts[3], 16) & 0x10000:
                    return True
    except (OSError, ValueError, StopIteration):
        pass
    return False


def wait_socket(path: Path, proc: subprocess.Popen[Any], deadline: float) -> str:
    """Until a unix socket accepts at `path`; "" or why not."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with status {proc.returncode}"
        if path.exists() and listening(path):
            return ""
        time.sleep(0.05)
    return f"no socket within {SERVE_READY_S:g} s"


def last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def boot(spec: BootSpec) -> dict[str, Any]:
    """Run one boot; write and return boot.json's content."""
    if spec.events_after is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", spec.events_after):
        raise LabError(f"bad --events-after '{spec.events_after}': want a marker name ([A-Za-z0-9_.-])")
    faultdev = spec.build / "bin" / "faultdev"
    if not faultdev.exists():
        raise LabError(f"{faultdev} is missing: build first (make)")
    labels = [m.label for m in spec.members]
    if len(set(labels)) != len(labels):
        raise LabError("two members have the same label")
    if not spec.members:
        raise LabError("no members (--member LABEL=SIZE[:FAULTPROFILE])")
    if spec.out.exists() and any(spec.out.iterdir()):
        raise LabError(f"{spec.out} is not empty")
    accel = spec.accel
    if accel == "auto":
        accel = "kvm" if kvm_usable() else "tcg"
    job_disk = job_tar(spec.job, spec.inputs)
    launcher = launcher_for(spec)

    # Mistakes and a host that cannot hold the boot's files: an error before
    # anything starts (no boot.json; a member image of the wrong size is the
    # caller's mistake). From the servers' start on, a failure is a failed
    # boot with boot.json.
    try:
        images_dir = spec.images_dir or Path(tempfile.mkdtemp(dir=spec.shm, prefix="tierlab-vm-images-"))
        images_dir.mkdir(parents=True, exist_ok=True)
        for m in spec.members:
            member_image(images_dir / f"{m.label}.img", m.size)
        spec.out.mkdir(parents=True, exist_ok=True)
        private = Path(tempfile.mkdtemp(dir=spec.shm, prefix="tierlab-vm-"))
    except OSError as e:
        launcher.close()
        raise LabError(f"cannot make the boot's files: {e}") from None
    except BaseException:
        launcher.close()
        raise

    result: dict[str, Any] = {
        "status": "failed", "reason": "", "job_rc": None, "backend": spec.backend,
        "connect": launcher.fields.get("connect"), "accel": accel,
        "cpus": spec.cpus, "mem_mib": spec.mem_mib, "timeout_s": spec.timeout,
        "budget_s": spec.job_budget(), "seed": spec.seed, "start_unix": time.time(),
        "image": {"key": spec.image.key, "vmlinux": str(spec.image.vmlinux),
                  "initramfs": str(spec.image.initramfs)},
        "job": str(spec.job), "inputs": [str(p) for p in spec.inputs],
        "members": [], "events": [], "times": {},
    }
    servers: list[tuple[Member, subprocess.Popen[Any]]] = []
    stopped = threading.Event()
    try:
        (private / "job.img").write_bytes(job_disk)
        with open(private / "results.img", "wb") as f:
            f.truncate(RESULTS_DISK)
        disks = [Disk("job", private / "job.img"), Disk("results", private / "results.img")]
        for m in spec.members:
            sock = private / f"{m.label}.sock"
            cmd = [str(faultdev), "serve", "--profile", m.serve_profile,
                   "--image", str(images_dir / f"{m.label}.img"), "--socket", str(sock),
                   "--seed", str(spec.seed), "--stats", str(spec.out / f"fault-{m.label}.json")]
            for s in spec.fault_sets.get(m.label, []):
                cmd += ["--set", s]
            log = open(spec.out / f"serve-{m.label}.log", "wb")
            try:
                p = start(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            finally:
                log.close()
            servers.append((m, p))
            result["members"].append({"label": m.label, "size": m.size, "profile": m.serve_profile,
                                      "sets": spec.fault_sets.get(m.label, []),
                                      "image": str(images_dir / f"{m.label}.img"),
                                      "socket": str(sock), "control": f"{sock}.ctl",
                                      "serve_command": cmd})
            disks.append(Disk(m.label, sock, nbd=True))
        deadline = time.monotonic() + SERVE_READY_S
        for m, p in servers:
            why = wait_socket(private / f"{m.label}.sock", p, deadline)
            if why:
                raise BootFailed(f"faultdev serve for {m.label}: {why}: "
                                 f"{last_line(spec.out / f'serve-{m.label}.log')}")

        guest = Guest(accel, spec.cpus, spec.mem_mib, spec.image.vmlinux, spec.image.initramfs,
                      kernel_cmdline(spec, len(disks)), disks, private / "console.sock")
        t0 = time.monotonic()
        result["qemu_start_unix"] = time.time()
        console = Console(launcher.start(guest, spec.out), spec.out / "console.log", t0)
        events = threading.Thread(target=send_events,
                                  args=(spec, private, console, stopped, result["events"], t0),
                                  daemon=True)
        events.start()
        ended = False
        deadline = t0 + spec.timeout
        while not ended and time.monotonic() < deadline:
            if spec.cancel is not None and spec.cancel.is_set():
                break
            ended = launcher.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        end = time.monotonic() - t0
        stopped.set()
        kill_error = ""
        if not ended:
            try:
                launcher.kill()
            except LabError as e:
                kill_error = str(e)   # still a timeout; its times and results are read below
        failure = launcher.outcome(killed=not ended)
        console.thread.join(timeout=10)
        events.join(timeout=CTL_TIMEOUT_S + 5)
        times = dict(console.times)
        times["to_poweroff_s" if ended else "killed_at_s"] = round(end, 3)
        result["times"] = times

        nfiles, results_error = read_results(private / "results.img", spec.out / "results")
        result["result_files"] = nfiles
        rc_file = spec.out / "results" / "job.rc"
        if rc_file.exists():
            try:
                result["job_rc"] = int(rc_file.read_text().strip())
            except ValueError:
                pass
        if not ended:
            result["status"], result["reason"] = "timeout", \
                f"no poweroff within {spec.timeout:g} s (killed)" + \
                (f"; {kill_error}" if kill_error else "")
        elif failure:
            result["reason"] = failure
        elif console.panic:
            result["reason"] = f"guest kernel panic: {console.panic}"
        elif results_error:
            result["reason"] = results_error
        elif result["job_rc"] is None:
            result["reason"] = "the results hold no job.rc"
        elif "results_written_s" not in times:
            # A tar cut short reads like a normal end of archive: without the
            # init's word that it finished, the results may be partial.
            result["reason"] = "the init never said the results were written (they may be partial)"
        elif result["job_rc"] != 0:
            result["reason"] = f"the job exited with status {result['job_rc']}" + \
                (" (its budget ran out)" if result["job_rc"] == 143 else "")
        else:
            result["status"] = "ok"
    except (BootFailed, LabError, OSError) as e:
        # A launcher that cannot start (or end) its guest, a server that does
        # not come up, a disk image that cannot be written (/dev/shm full): a
        # failed boot, its children cleaned up below.
        result["reason"] = "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
    finally:
        stopped.set()
        launcher.close()
        result.update(launcher.fields)
        for i, (m, p) in enumerate(servers):
            code = stop(p, SERVER_STOP_S)
            if i < len(result["members"]):
                result["members"][i]["serve_rc"] = code
        shutil.rmtree(private, ignore_errors=True)
    result["wall_s"] = round(time.time() - result["start_unix"], 3)
    (spec.out / "boot.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


class BootFailed(Exception):
    pass


def send_events(spec: BootSpec, private: Path, console: Console, stopped: threading.Event,
                out: list[dict[str, Any]], t0: float) -> None:
    """Each event at its time after the job's start (or its marker), until the
    guest stops."""
    pending = sorted(spec.events, key=lambda e: e.at_s)
    for e in pending:
        out.append({"at_s": e.at_s, "label": e.label, "command": " ".join(e.command), "sent": False})
    if not pending:
        return
    # Wait for the job to start, or for its marker (or for the guest to stop).
    key = "job_start_s" if spec.events_after is None else f"mark_{spec.events_after}"
    with console.marked:
        while key not in console.times:
            if stopped.is_set():
                return
            console.marked.wait(0.2)
    start = t0 + console.times[key]
    faultdev = spec.build / "bin" / "faultdev"
    for e, rec in zip(pending, out):
        if stopped.wait(max(0.0, start + e.at_s - time.monotonic())):
            return
        rec["sent_s"] = round(time.monotonic() - t0, 3)
        cmd = [str(faultdev), "ctl", "--control", str(private / f"{e.label}.sock.ctl"), *e.command]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=CTL_TIMEOUT_S)
            rec.update(sent=True, rc=p.returncode, reply=(p.stdout.strip() or p.stderr.strip())[:500])
        except subprocess.TimeoutExpired:
            rec.update(sent=True, rc=None, reply=f"no answer within {CTL_TIMEOUT_S:g} s")


def summary(result: dict[str, Any], out: Path) -> str:
    t = result.get("times", {})

    def s(key: str) -> str:
        return f"{t[key]:.1f} s" if key in t else "-"
    line = (f"boot {result['status']}: to /init {s('to_init_s')}, job start {s('job_start_s')}, "
            f"to poweroff {s('to_poweroff_s')}")
    if result["status"] != "ok":
        line += f"; {result['reason']}"
    return line + f"; {out / 'boot.json'}"
