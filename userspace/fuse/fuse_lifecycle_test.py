"""The mount lifecycle a lab (and `mount -a`) relies on: after an unmount
returns, the members can be mounted (or checked) again at once, by every way
of unmounting; the mount's source is the whole member list, so `findmnt -S
A:B` and `umount A:B` find it; a second mount of a mounted set says "already
mounted on X"; and an opener that finds the members held by a process without
a mount (a daemon still writing out after its unmount) waits for it.

The kernel does not wait for a FUSE daemon at unmount, so the remount cycles
here race a finishing daemon; test_an_opener_waits_for_a_holder_without_a_mount
makes that race certain by holding the lock itself. No test sleeps to
synchronise: each waits for an event (a line on a pipe, a process's exit)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
from pathlib import Path

import pytest

from fusetest import fsck_clean, image, needs_fuse, two_members
from tierlab.testing import run, tool

pytestmark = needs_fuse

CYCLES = 20


def mount(*args: Path | str) -> None:
    proc = run([tool("tierfs"), "mount", *args])
    assert proc.returncode == 0, proc.stderr


def leave_unmounted(*mnts: Path) -> None:
    """After a failure: nothing of the test stays mounted."""
    for m in mnts:
        if os.path.ismount(m):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


UNMOUNTS = {
    "umount": lambda mnt: ["umount", str(mnt)],
    "fusermount3 -u": lambda mnt: ["fusermount3", "-u", str(mnt)],
}


@pytest.mark.parametrize("how", sorted(UNMOUNTS))
def test_remount_at_once_after_unmount(how: str, tmp_path: Path) -> None:
    """Mount (a daemon), write, unmount, mount again at once: CYCLES times on a
    fresh filesystem, then fsck right after the last unmount."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        for i in range(CYCLES):
            mount(dev, mnt)
            assert sorted(os.listdir(mnt)) == [f"f{j:02d}" for j in range(i)]
            (mnt / f"f{i:02d}").write_bytes(os.urandom(64 << 10))
            proc = run(UNMOUNTS[how](mnt))
            assert proc.returncode == 0, f"cycle {i}: {proc.stderr}"
    finally:
        leave_unmounted(mnt)
    fsck_clean(dev)  # at once: fsck waits for the daemon too
    proc = run([tool("tierfs"), "fsck", dev])
    assert f"{CYCLES} entries" in proc.stdout, proc.stdout


def test_the_source_is_the_member_list(tmp_path: Path) -> None:
    a, b = two_members(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    mount(a, b, mnt)
    try:
        source = f"{a}:{b}"
        proc = run(["findmnt", "-n", "-o", "TARGET,FSTYPE", "-S", source])
        assert proc.returncode == 0 and proc.stdout.split() == [str(mnt), "fuse.tierfs"], proc.stdout + proc.stderr
        proc = run(["umount", source])
        assert proc.returncode == 0, proc.stderr
        assert not os.path.ismount(mnt)
        # At once, by relative paths: made absolute, the same source.
        proc = run([tool("tierfs"), "mount", "a.img", "b.img", "other"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        proc = run(["findmnt", "-n", "-o", "TARGET", "-S", source])
        assert proc.stdout.split() == [str(other)], proc.stdout + proc.stderr
        assert run(["umount", source]).returncode == 0
    finally:
        leave_unmounted(mnt, other)
    fsck_clean([a, b])


def test_a_mounted_set_is_refused_as_already_mounted(tmp_path: Path) -> None:
    """A second mount of a mounted set (the fstab line mounted twice by `mount
    -a`, through mount.fuse.tierfs; members in another order; a member by
    another name) says where it is mounted, in one line, nonzero; fsck too;
    and `mount -a` finds the fstab line mounted."""
    a, b = two_members(tmp_path)
    mnt, mnt2 = tmp_path / "mnt", tmp_path / "mnt2"
    mnt.mkdir()
    mnt2.mkdir()
    helper = tool("mount.fuse.tierfs")
    proc = run([helper, f"{a}:{b}", mnt, "-o", "rw,nofail"])
    assert proc.returncode == 0, proc.stderr
    try:
        (tmp_path / "alias.img").symlink_to(a)
        for args in ([helper, f"{a}:{b}", mnt, "-o", "rw,nofail"],
                     [helper, f"{b}:{a}", mnt2],
                     [tool("tierfs"), "mount", tmp_path / "alias.img", b, mnt2]):
            proc = run(args)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1, proc.stderr
            assert lines[0].startswith("tierfs mount:") and f"already mounted on {mnt}" in lines[0], lines
            assert not os.path.ismount(mnt2)
        proc = run([tool("tierfs"), "fsck", a, b])
        assert proc.returncode == 8 and f"already mounted on {mnt}" in proc.stderr, proc.stderr
        proc = run([tool("tierfs"), "format", "--force", a, b])
        assert proc.returncode == 1 and f"already mounted on {mnt}" in proc.stderr, proc.stderr
        # Issue 18: the writing commands on any one member, by any name.
        for args in (["fsck", "-y", a, b], ["fsck", "-y", b, tmp_path / "alias.img"]):
            proc = run([tool("tierfs"), *args])
            assert proc.returncode == 8 and f"already mounted on {mnt}" in proc.stderr, (args, proc.stderr)
        for devs in ([b], [tmp_path / "alias.img"]):
            proc = run([tool("tierfs"), "format", "--force", *devs])
            assert proc.returncode == 1 and f"already mounted on {mnt}" in proc.stderr, (devs, proc.stderr)
        # mount -a itself sees the fstab line mounted (it compares the source)
        # and runs no helper.
        fstab = tmp_path / "fstab"
        fstab.write_text(f"{a}:{b} {mnt} fuse.tierfs defaults,nofail 0 0\n")
        proc = run(["mount", "-a", "-v", "--fstab", fstab])
        assert proc.returncode == 0 and "already mounted" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert (mnt / ".").is_dir() and os.listdir(mnt) == []  # the first mount still serves
        assert run(["umount", f"{a}:{b}"]).returncode == 0
    finally:
        leave_unmounted(mnt, mnt2)
    fsck_clean([a, b])


@pytest.mark.parametrize("opener", ["mount", "fsck"])
def test_an_opener_waits_for_a_holder_without_a_mount(opener: str, tmp_path: Path) -> None:
    """The test holds the member's lock as a daemon does while it writes out
    after its unmount; `tierfs mount` / `tierfs fsck` must wait (it says so on
    stderr), and finish once the lock is let go."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    holder = open(dev, "rb")
    fcntl.flock(holder, fcntl.LOCK_EX)
    args = [tool("tierfs"), "mount", dev, mnt] if opener == "mount" else [tool("tierfs"), "fsck", dev]
    proc = subprocess.Popen([str(x) for x in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        # The opener says it waits (bounded: a silent hang fails, never hangs the test).
        ready, _, _ = select.select([proc.stderr], [], [], 120)
        assert ready, "the opener said nothing within 120 s"
        line = proc.stderr.readline()
        assert "waiting for the tierfs process holding it" in line, line
        assert proc.poll() is None and not os.path.ismount(mnt)
    finally:
        holder.close()  # lets go of the lock
    try:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        if opener == "mount":
            assert os.path.ismount(mnt)
            assert run(["umount", mnt]).returncode == 0
        else:
            assert "clean" in out
    finally:
        leave_unmounted(mnt)
    fsck_clean(dev)


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    """A holder that never lets go: the opener gives up with "in use" after
    TIERFS_LOCK_WAIT seconds (0: at once), nonzero, nothing mounted."""
    dev = image(tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(dev, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        for wait in ("0", "2"):
            env = {**os.environ, "TIERFS_LOCK_WAIT": wait}
            proc = run([tool("tierfs"), "mount", dev, mnt], env=env)
            got = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and got, proc.stderr
            assert f"in use (another tierfs mount or fsck has held it for {wait} s)" in got[-1], got
            # Before it, at most the line saying it waits (never with 0).
            assert all("waiting for the tierfs process" in g for g in got[:-1]) and len(got) <= (1 if wait == "0" else 2)
            assert not os.path.ismount(mnt)
        proc = run([tool("tierfs"), "fsck", dev], env={**os.environ, "TIERFS_LOCK_WAIT": "0"})
        assert proc.returncode == 8 and "in use" in proc.stderr, proc.stderr
        proc = run([tool("tierfs"), "mount", dev, mnt], env={**os.environ, "TIERFS_LOCK_WAIT": "soon"})
        assert proc.returncode == 1 and "TIERFS_LOCK_WAIT=soon: want a number of seconds" in proc.stderr
    fsck_clean(dev)


def test_a_device_named_twice_is_refused_at_once(tmp_path: Path) -> None:
    """It would otherwise wait for its own lock."""
    dev = image(tmp_path / "fs.img")
    (tmp_path / "alias.img").symlink_to(dev)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["mount", dev, tmp_path / "alias.img", mnt], ["fsck", dev, dev]):
        proc = run([tool("tierfs"), *args], env={**os.environ, "TIERFS_LOCK_WAIT": "60"})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode in (1, 8) and len(lines) == 1 and "the same device, named twice" in lines[0], lines
    assert not os.path.ismount(mnt)


def test_a_member_path_with_colons_is_found_mounted(tmp_path: Path) -> None:
    """/dev/disk/by-path names hold ':'; the mount source joins members with ':'
    too. A second mount must still see the set mounted (at once: with no lock
    wait allowed, a miss would end in "in use" instead)."""
    d = tmp_path / "pci-0000:00:17.0-ata-1"
    d.mkdir()
    dev = image(d / "fs:0.img")
    mnt, mnt2 = tmp_path / "mnt", tmp_path / "mnt2"
    mnt.mkdir()
    mnt2.mkdir()
    mount(dev, mnt)
    try:
        env = dict(os.environ, TIERFS_LOCK_WAIT="0")
        proc = subprocess.run([str(tool("tierfs")), "mount", str(dev), str(mnt2)], capture_output=True,
                              text=True, env=env, timeout=60)
        assert proc.returncode == 1 and f"already mounted on {mnt}" in proc.stderr, proc.stderr
        assert run(["umount", mnt]).returncode == 0
    finally:
        leave_unmounted(mnt, mnt2)
    fsck_clean(dev)
