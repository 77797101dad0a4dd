"""The VM lab's libvirt backend (`--backend libvirt [--connect URI]...`;
docs/lab/vmlab.md): the guest vmboot.boot() describes (vmboot.Guest), started
as a transient libvirt domain instead of a QEMU child of ours.

    launcher = LibvirtLauncher("qemu:///system")   # connects; a LabError if it cannot
    console = launcher.start(guest, out)            # DIR/domain.xml, createXML, the console's lines

The domain is the direct backend's command line in libvirt's words: q35, TCG
(`type='qemu'`, `<cpu mode='maximum'/>`) or KVM (`host-passthrough`), ACPI,
kernel, initrd and command line booted directly, no network, destroy on
poweroff, reboot and crash; the job and results disks as raw files, every
member an NBD disk on its faultdev server's unix socket (cache none), all
virtio with the label as serial; the serial console a unix socket we listen
on and QEMU connects to (ConsoleSocket: no virtlogd in between, nothing lost),
read by vmboot's Console as QEMU's stdout is. It is transient and
auto-destroyed with our connection, named tierlab-PID-boot-N; its end
(shutdown, destroyed, crashed, failed) comes from libvirt's lifecycle events.

Invariants: only local URIs (the NBD sockets, the disks and the console socket
are on this host); only our own domain is ever destroyed, and kill() returns
only once it is gone (or raises); on a system daemon the domain's QEMU runs as
our user and unconfined (a static DAC label without relabelling, no MAC
label), as the direct backend's QEMU does, so nothing of ours is chowned or
opened to other users. python3-libvirt is imported only when this backend is
used."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import socket
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from tierlab import LabError
from tierlab.vmboot import KILL_WAIT_S, QEMU, Guest

DEFAULT_URI = "qemu:///system"
LOCAL_SCHEMES = ("qemu", "qemu+unix")
POLL_S = 2.0           # how often wait() asks whether the domain still runs (events are the rule)
EVENT_GRACE_S = 2.0    # for the lifecycle event of a domain that is gone
# kill(): the domain may take vmboot.KILL_WAIT_S (60 s) to be gone. One
# destroy can take 15 s (libvirt's SIGTERM, 10 s, SIGKILL, 5 s) and wait 30 s
# for the domain's job lock; a destroy that fails is tried again every
# KILL_RETRY_S.
KILL_RETRY_S = 1.0
CONSOLE_ACCEPT_S = 10.0   # QEMU connects to the console socket as it starts, before createXML returns
# Why a domain stopped (libvirt's VIR_DOMAIN_EVENT_STOPPED_*); boot.json's end_state.reason.
STOP_DETAILS = ("SHUTDOWN", "DESTROYED", "CRASHED", "MIGRATED", "SAVED", "FAILED", "FROM_SNAPSHOT")

_BOOTS = itertools.count(1)
_setup_lock = threading.Lock()
_setup_done = False


def _libvirt() -> Any:
    """python3-libvirt, with its event loop running (events need it registered
    before a connection opens) and its stderr printing silenced (its errors
    come to us as exceptions)."""
    global _setup_done
    try:
        import libvirt  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise LabError("libvirt: python3-libvirt is not installed: run scripts/install-deps lab") \
            from None
    with _setup_lock:
        if not _setup_done:
            libvirt.registerErrorHandler(lambda *_: None, None)
            libvirt.virEventRegisterDefaultImpl()

            def loop() -> None:
                while True:
                    if libvirt.virEventRunDefaultImpl() < 0:
                        time.sleep(0.1)
            threading.Thread(target=loop, name="libvirt-events", daemon=True).start()
            _setup_done = True
    return libvirt


def message(e: Exception) -> str:
    get = getattr(e, "get_error_message", None)
    text = (get() if get is not None else None) or str(e)
    return "; ".join(ln.strip() for ln in text.splitlines() if ln.strip())


def check_local(uri: str) -> None:
    """A URI whose daemon runs QEMU on this host, or a LabError saying why not."""
    u = urlsplit(uri)
    if u.scheme not in LOCAL_SCHEMES or u.netloc or u.path not in ("/system", "/session"):
        raise LabError(
            f"libvirt: {uri} is not a local QEMU URI (want qemu:///system or qemu:///session, "
            "optionally ?socket=PATH): the fault devices' NBD sockets, the job and results disks "
            "and the console socket are on this host, so a domain on another host cannot reach them")


def connect(uri: str) -> Any:
    check_local(uri)
    lv = _libvirt()
    try:
        return lv.open(uri)
    except lv.libvirtError as e:
        raise LabError(f"libvirt: cannot connect to {uri}: {message(e)}") from None


def check(uri: str) -> None:
    """Whether `uri` is local and its daemon answers (a LabError if not)."""
    conn = connect(uri)
    try:
        conn.getVersion()
    except Exception as e:
        raise LabError(f"libvirt: {uri}: {message(e)}") from None
    finally:
        conn.close()


def domain_xml(guest: Guest, name: str, *, emulator: str, run_as: str | None,
               mac_models: list[str]) -> str:
    """The domain of `guest`. run_as: the DAC label "+UID:+GID" QEMU runs as
    (a system daemon; None on a session daemon, whose QEMU is its own user);
    mac_models: the daemon's MAC security models (apparmor, selinux), each
    turned off for this domain."""
    dom = ET.Element("domain", type="kvm" if guest.accel == "kvm" else "qemu")
    ET.SubElement(dom, "name").text = name
    ET.SubElement(dom, "memory", unit="MiB").text = str(guest.mem_mib)
    ET.SubElement(dom, "vcpu").text = str(guest.cpus)
    os_ = ET.SubElement(dom, "os")
    ET.SubElement(os_, "type", arch="x86_64", machine="q35").text = "hvm"
    ET.SubElement(os_, "kernel").text = str(guest.kernel)
    ET.SubElement(os_, "initrd").text = str(guest.initrd)
    ET.SubElement(os_, "cmdline").text = guest.cmdline
    ET.SubElement(ET.SubElement(dom, "features"), "acpi")
    # -cpu max under TCG (tierfs needs SSE4.2's crc32), -cpu host under KVM
    ET.SubElement(dom, "cpu", mode="host-passthrough" if guest.accel == "kvm" else "maximum",
                  check="none")
    ET.SubElement(dom, "clock", offset="utc")
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        ET.SubElement(dom, event).text = "destroy"
    devices = ET.SubElement(dom, "devices")
    ET.SubElement(devices, "emulator").text = emulator
    if len(guest.disks) > 26:
        raise LabError(f"{len(guest.disks)} disks: the libvirt backend names at most 26 (vda-vdz)")
    for i, d in enumerate(guest.disks):
        if d.nbd:
            disk = ET.SubElement(devices, "disk", type="network", device="disk")
            ET.SubElement(disk, "driver", name="qemu", type="raw", cache="none")
            src = ET.SubElement(disk, "source", protocol="nbd")
            ET.SubElement(src, "host", transport="unix", socket=str(d.path))
        else:
            disk = ET.SubElement(devices, "disk", type="file", device="disk")
            ET.SubElement(disk, "driver", name="qemu", type="raw")
            ET.SubElement(disk, "source", file=str(d.path))
        ET.SubElement(disk, "target", dev=f"vd{chr(ord('a') + i)}", bus="virtio")
        ET.SubElement(disk, "serial").text = d.serial
    # QEMU connects to our socket (mode='connect'): no virtlogd in between, and
    # nothing the guest writes before we read is lost (ConsoleSocket).
    serial = ET.SubElement(devices, "serial", type="unix")
    ET.SubElement(serial, "source", mode="connect", path=str(guest.console))
    ET.SubElement(serial, "target", port="0")
    ET.SubElement(devices, "controller", type="usb", model="none")
    ET.SubElement(devices, "memballoon", model="none")
    if run_as is not None:
        label = ET.SubElement(dom, "seclabel", type="static", model="dac", relabel="no")
        ET.SubElement(label, "label").text = run_as
    for model in mac_models:
        ET.SubElement(dom, "seclabel", type="none", model=model)
    ET.indent(dom)
    # libvirt's own spelling of empty elements (<acpi/>); a quote in a value is &quot;
    text = re.sub(r"<(\w+) />", r"<\1/>", ET.tostring(dom, encoding="unicode"))
    return text.replace('" />', '"/>') + "\n"


class ConsoleSocket:
    """The host's end of the domain's serial console (`<serial type='unix'>`,
    mode='connect'): a unix socket listening at `path` (in the boot's private
    directory, 0700) before the domain starts, which QEMU connects to as it
    starts. What the guest writes before we read waits in the socket, and once
    that is full in QEMU (the guest's UART holds its output): nothing is lost,
    nothing is rotated, and no virtlogd is in between. The socket is 0600: QEMU
    runs as our user (the domain's DAC label, or a session daemon's own QEMU).
    lines() feeds vmboot.Console as QEMU's stdout does for the direct backend;
    they end when QEMU closes its end (the domain ended) or at close()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: socket.socket | None = None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(str(path))
            os.chmod(path, 0o600)
            self.listener.listen(1)
        except OSError as e:
            self.listener.close()
            raise LabError(f"libvirt: console socket {path}: {e.strerror or e}") from None

    def accept(self, timeout: float) -> bool:
        """Whether QEMU connected within `timeout` s."""
        self.listener.settimeout(timeout)
        try:
            self.conn, _ = self.listener.accept()   # blocking, as the listener had no timeout before
        except OSError:                              # socket.timeout, or close() meanwhile
            return False
        return True

    def lines(self) -> Iterator[bytes]:
        """The console's lines as they come (the last one without its newline
        if the guest did not end it), until QEMU closes its end."""
        assert self.conn is not None
        try:
            with self.conn.makefile("rb") as f:
                yield from f
        except OSError:
            pass

    def close(self) -> None:
        """Ends lines() and stops listening; idempotent."""
        for s in (self.conn, self.listener):
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)   # wakes a reader blocked in recv
            except OSError:
                pass
            s.close()


class LibvirtLauncher:
    """One guest as a transient domain on the daemon at `uri` (vmboot.Launcher).
    The connection is opened here and held until close(): the domain is
    started with AUTODESTROY, so it cannot outlive it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.conn = connect(uri)
        self.lv = _libvirt()
        self.name = f"tierlab-{os.getpid()}-boot-{next(_BOOTS)}"
        self.fields: dict[str, Any] = {"connect": uri}
        self.dom: Any = None
        self.console: ConsoleSocket | None = None
        self.ended = threading.Event()     # the domain stopped (or we lost the daemon)
        self.closed = threading.Event()
        self.kill_failed = False           # kill() gave up: the domain may still run
        self.stop_reason: str | None = None
        self.last_poll = 0.0
        lv = self.lv
        self.stop_names = {getattr(lv, f"VIR_DOMAIN_EVENT_STOPPED_{d}"): d.lower() for d in STOP_DETAILS}
        try:
            self.fields["libvirt_uri"] = self.conn.getURI()
            self.callback = self.conn.domainEventRegisterAny(
                None, lv.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._lifecycle, None)
            self.conn.registerCloseCallback(self._lost, None)
        except lv.libvirtError as e:
            self.conn.close()
            raise LabError(f"libvirt: {uri}: {message(e)}") from None

    # Called on libvirt's event loop thread.
    def _lifecycle(self, conn: Any, dom: Any, event: int, detail: int, opaque: Any) -> None:
        if event == self.lv.VIR_DOMAIN_EVENT_STOPPED and dom.name() == self.name:
            self.stop_reason = self.stop_names.get(detail, f"detail {detail}")
            self.ended.set()

    def _lost(self, conn: Any, reason: int, opaque: Any) -> None:
        if not self.ended.is_set() and not self.closed.is_set():
            self.stop_reason = f"unknown: the connection to {self.uri} closed (reason {reason})"
            self.ended.set()

    def _security(self) -> tuple[str | None, list[str]]:
        caps = ET.fromstring(self.conn.getCapabilities())
        models = [m.text or "" for m in caps.findall("./host/secmodel/model")]
        system = urlsplit(self.fields["libvirt_uri"]).path == "/system"
        run_as = f"+{os.geteuid()}:+{os.getegid()}" if system else None
        return run_as, [m for m in models if m not in ("", "none", "dac")]

    def start(self, guest: Guest, out: Path) -> Iterator[bytes]:
        lv = self.lv
        try:
            run_as, mac = self._security()
        except lv.libvirtError as e:
            raise LabError(f"libvirt: {self.uri}: {message(e)}") from None
        xml = domain_xml(guest, self.name, emulator=shutil.which(QEMU) or QEMU, run_as=run_as,
                         mac_models=mac)
        (out / "domain.xml").write_text(xml)
        self.fields.update(domain=self.name, domain_xml=str(out / "domain.xml"))
        self.console = ConsoleSocket(guest.console)   # listening before QEMU connects
        t = time.monotonic()
        try:
            self.dom = self.conn.createXML(xml, lv.VIR_DOMAIN_START_AUTODESTROY)
        except lv.libvirtError as e:
            raise LabError(f"libvirt: {self.uri}: domain {self.name} cannot start: {message(e)}") \
                from None
        self.fields["launch_s"] = round(time.monotonic() - t, 3)
        if not self.console.accept(CONSOLE_ACCEPT_S):
            raise LabError(f"libvirt: {self.uri}: domain {self.name} started, but its QEMU did not "
                           f"connect to the console socket {guest.console} within {CONSOLE_ACCEPT_S:g} s")
        return self.console.lines()

    def _active(self) -> bool:
        try:
            return bool(self.dom.isActive())
        except self.lv.libvirtError as e:
            # Gone (a transient domain that stopped), or the daemon does not answer:
            # only the first is an end; the close callback tells the second.
            return e.get_error_code() != self.lv.VIR_ERR_NO_DOMAIN

    def _gone(self, reason: str) -> None:
        """The domain no longer runs: its event, or `reason` without one."""
        if not self.ended.wait(EVENT_GRACE_S):
            self.stop_reason = self.stop_reason or reason
            self.ended.set()

    def wait(self, timeout: float) -> bool:
        if self.ended.wait(timeout):
            return True
        # Lifecycle events tell the end; a poll now and then in case one is lost.
        if time.monotonic() - self.last_poll >= POLL_S:
            self.last_poll = time.monotonic()
            if not self._active():
                self._gone("unknown (the domain is gone without a lifecycle event)")
        return self.ended.is_set()

    def kill(self) -> None:
        """Destroy the domain and return only once it is gone (its stop event,
        or libvirt no longer knows it), so that boot() stops the NBD servers
        and removes the disks under no running QEMU. A destroy that fails (the
        domain's job lock is busy, QEMU did not die of SIGKILL in time, the
        daemon does not answer) is tried again; after KILL_WAIT_S a LabError
        says the domain did not end. No destroy() starts after KILL_WAIT_S, but
        one that blocks in the daemon holds this up: KILL_WAIT_S is the least
        it takes to give up, not the most."""
        if self.dom is None or self.ended.is_set():
            return
        deadline = time.monotonic() + KILL_WAIT_S
        why = ""
        while True:
            try:
                self.dom.destroy()
                why = ""
            except self.lv.libvirtError as e:
                why = message(e)   # it stopped meanwhile (its event says how), or it could not
            if self.ended.wait(min(KILL_RETRY_S, max(0.0, deadline - time.monotonic()))):
                return
            if not self._active():
                self._gone("destroyed")
                return
            if time.monotonic() >= deadline:
                break
        self.kill_failed = True
        msg = (f"libvirt: {self.uri}: domain {self.name} did not end within {KILL_WAIT_S:g} s of "
               "tierlab's destroy" + (f" (libvirt: {why})" if why else ""))
        self.fields["end_state"] = {"state": "unknown", "reason": msg}
        raise LabError(msg)

    def outcome(self, killed: bool) -> str:
        reason = self.stop_reason or "unknown"
        self.fields["end_state"] = {"state": "shutoff", "reason": reason}
        if reason == "shutdown":
            return ""
        return (f"the domain stopped ({reason}), not by the guest's poweroff; QEMU's side is in "
                f"libvirt's log of {self.name}")

    def close(self) -> None:
        if self.closed.is_set():
            return
        if self.dom is not None and not self.ended.is_set() and not self.kill_failed:
            try:
                self.kill()
            except LabError:
                pass   # in fields["end_state"]; closing the connection below auto-destroys it
        self.closed.set()
        if self.console is not None:
            self.console.close()
        for undo in (lambda: self.conn.domainEventDeregisterAny(self.callback),
                     self.conn.unregisterCloseCallback, self.conn.close):
            try:
                undo()
            except Exception:
                pass


# ------------------------------------------------------------------ command line

def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("qemu", "libvirt"), default="qemu",
                   help="qemu: run QEMU directly (default); libvirt: a transient libvirt domain")
    p.add_argument("--connect", action="append", default=[], metavar="URI",
                   help=f"libvirt's URI (default {DEFAULT_URI}; local only, e.g. "
                        "qemu:///session or qemu:///system?socket=PATH); vm pair: repeatable, "
                        "pair i runs on the (i mod n)-th")


def backend_uris(args: argparse.Namespace, several: bool) -> list[str]:
    """The --connect URIs, each local and answering ([] for --backend qemu)."""
    if args.backend != "libvirt":
        if args.connect:
            raise LabError("--connect is for --backend libvirt")
        return []
    uris = args.connect or [DEFAULT_URI]
    if len(uris) > 1 and not several:
        raise LabError("one guest, one --connect URI")
    for uri in dict.fromkeys(uris):
        check(uri)
    return uris
