"""The NBD export (faultdev serve = nbdkit + the faultdev plugin), driven by libnbd
and nbdcopy: the same delays and errors as in process, and run-time control.

Needs the build ($TIERFS_BUILD, default build/), nbdkit, nbdcopy and python3-libnbd.
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierlab.testing import build_dir

import nbd  # python3-libnbd, installed by scripts/install-deps (test group)

# The build directory ($TIERFS_BUILD, else build/); a missing binary fails the test.
BUILD = build_dir()
FAULTDEV = BUILD / "bin" / "faultdev"


class Served:
    """`faultdev serve` in the background; stopped (SIGTERM) on exit."""

    def __init__(self, tmp_path, profile, size=32 << 20, args=(), image=None):
        self.image = image or tmp_path / "disk.img"
        if not self.image.exists():
            with open(self.image, "wb") as f:
                f.truncate(size)
        self.sock = tmp_path / "nbd.sock"
        self.ctl = tmp_path / "nbd.sock.ctl"
        self.stats = tmp_path / "stats.json"
        self.proc = subprocess.Popen(
            [str(FAULTDEV), "serve", "--profile", profile, "--image", str(self.image), "--socket", str(self.sock),
             "--stats", str(self.stats), *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 15
        while not (self.sock.exists() and self.ctl.exists()):
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("serve did not come up")
            time.sleep(0.02)

    def connect(self):
        h = nbd.NBD()
        h.connect_unix(str(self.sock))
        return h

    def ctl_cmd(self, *words):
        r = subprocess.run([str(FAULTDEV), "ctl", "--control", str(self.ctl), *map(str, words)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        # An empty reply means the server closed the connection without answering
        # (in CI: nbdkit aborting, see test_client_hanging_up_with_replies_pending):
        # say whether it was still running.
        assert r.stdout.strip(), f"empty reply to {words}; serve exit status {self.proc.poll()}"
        return r.stdout.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def timed(fn, *args):
    t = time.monotonic()
    fn(*args)
    return (time.monotonic() - t) * 1000


def test_fixed_delay_over_nbd(tmp_path):
    with Served(tmp_path, "hdd-fixed-10ms") as s:
        h = s.connect()
        lat = [timed(h.pread, 4096, i * 4096) for i in range(30)]
        wlat = [timed(h.pwrite, b"\x5a" * 4096, i * 4096) for i in range(10)]
        h.shutdown()
    assert min(lat) >= 10.0
    # The device's 10 ms plus the NBD round trip; never less, and how much more
    # depends on the machine's load (the upper bound only catches a wrong unit).
    assert 10.0 <= statistics.median(lat) < 100.0
    assert statistics.median(wlat) >= 10.0
    stats = json.loads(s.stats.read_text())  # written when nbdkit exits
    assert stats["ops"]["read"]["ops"] >= 30
    assert stats["ops"]["write"]["ops"] == 10
    assert stats["seed"] == 1
    assert s.image.read_bytes()[:4096] == b"\x5a" * 4096


def test_errors_over_nbd_and_nbdcopy(tmp_path):
    # nbdcopy quits on the first EIO with other reads in flight; --threads 1 is what
    # lets nbdkit 1.32 survive that (test_client_hanging_up_with_replies_pending).
    with Served(tmp_path, "hdd-flaky", args=["--set", "hdd.write_cache=0", "--threads", "1"]) as s:
        h = s.connect()
        h.pread(4096, 0)
        with pytest.raises(nbd.Error) as e:
            h.pread(4096, 16 << 20)
        assert e.value.errno in ("EIO", 5)
        h.pread(4096, 17 << 20)  # past the range: fine
        h.pwrite(b"\1" * 4096, 16 << 20)  # writes there are fine
        stats = json.loads(s.ctl_cmd("stats"))
        assert stats["injected"]["eio"] == 1
        # nbdcopy over the whole device hits the bad range and fails.
        r = subprocess.run(["nbdcopy", f"nbd+unix:///?socket={s.sock}", str(tmp_path / "copy.img")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert "Input/output error" in r.stderr or "EIO" in r.stderr, r.stderr
        assert s.ctl_cmd("clear-errors").startswith("ok")
        h.pread(4096, 16 << 20)
        h.shutdown()


# A client that sends reads, never reads a reply and is killed -- what nbdcopy does
# when it quits on an EIO. The first reply fills the socket, so the ones after it are
# still to be sent when the client goes.
HANGUP_CLIENT = """
import nbd, sys, time
h = nbd.NBD()
h.connect_unix(sys.argv[1])
for i in range(16):
    h.aio_pread(nbd.Buffer(256 << 10), i * (256 << 10))
print("sent", flush=True)
time.sleep(60)
"""


def test_client_hanging_up_with_replies_pending(tmp_path):
    # With several worker threads per connection nbdkit 1.32 aborts here (an assert
    # in raw_send_socket: the first failed reply closes the socket under the next
    # one), taking the device, its stats and its cache record with it.
    with Served(tmp_path, "nvme", args=["--threads", "1"]) as s:
        client = subprocess.Popen([sys.executable, "-c", HANGUP_CLIENT, str(s.sock)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert client.stdout.readline() == "sent\n"
            time.sleep(0.3)  # the server answers what it can; the socket fills
        finally:
            client.kill()
            client.wait()
            client.stdout.close()
        time.sleep(0.3)  # the abort follows the failed reply at once
        assert s.proc.poll() is None
        assert "injected" in json.loads(s.ctl_cmd("stats"))  # the control socket still answers
        h = s.connect()
        h.pread(4096, 0)
        h.shutdown()


def test_nbdcopy_moves_the_data(tmp_path):
    img = tmp_path / "src.img"
    data = os.urandom(4 << 20)
    img.write_bytes(data)
    with Served(tmp_path, "nvme", image=img) as s:
        out = tmp_path / "out.img"
        subprocess.run(["nbdcopy", f"nbd+unix:///?socket={s.sock}", str(out)], check=True, timeout=120)
        assert out.read_bytes() == data
        stats = json.loads(s.ctl_cmd("stats"))
        assert stats["ops"]["read"]["bytes"] >= 4 << 20


def test_stall_command_while_served(tmp_path):
    with Served(tmp_path, "passthrough") as s:
        h = s.connect()
        assert timed(h.pread, 4096, 0) < 200
        assert s.ctl_cmd("stall", 0.6).startswith("ok")
        t = timed(h.pread, 4096, 0)
        assert 550 <= t <= 5000
        stats = json.loads(s.ctl_cmd("stats"))
        assert stats["stall"]["commanded"] == 1
        assert stats["stall"]["stalled_s"] >= 0.55
        h.shutdown()


def test_power_cut_while_served(tmp_path):
    with Served(tmp_path, "powercut", size=8 << 20) as s:
        h = s.connect()
        h.pwrite(b"\xaa" * 65536, 0)
        h.flush()  # durable
        for i in range(1, 64):
            h.pwrite(bytes([i]) * 4096, 65536 + i * 4096)  # cached, unflushed
        assert h.pread(4096, 65536 + 4096) == b"\x01" * 4096  # reads see the cache
        reply = s.ctl_cmd("powercut", 11)
        assert reply.startswith("ok power cut: kept")
        with pytest.raises(nbd.Error):
            h.pread(4096, 0)  # powered off
        assert s.ctl_cmd("poweron").startswith("ok")
        assert h.pread(65536, 0) == b"\xaa" * 65536  # flushed data survived
        stats = json.loads(s.ctl_cmd("stats"))
        assert stats["injected"]["power_cuts"] == 1
        assert stats["cache"]["cut_kept"] + stats["cache"]["cut_dropped"] + stats["cache"]["cut_torn"] == 63
        h.shutdown()
    assert s.image.read_bytes()[:65536] == b"\xaa" * 65536


def test_serve_rejects_bad_input(tmp_path):
    r = subprocess.run([str(FAULTDEV), "serve", "--profile", "no-such", "--image", tmp_path / "x", "--socket",
                        tmp_path / "s"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "x").touch()
    r = subprocess.run([str(FAULTDEV), "serve", "--profile", "nvme", "--image", tmp_path / "x", "--socket",
                        tmp_path / "s", "--threads", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
