"""Per-file options through a real FUSE mount (docs/usage.md "Per-file
options"): the tierfs.* xattrs with setfattr/getfattr and the os module (the
kernel passes the namespace through to FUSE), their validation with the
daemon's one-line reason, chattr's permission rule (the owner or CAP_FOWNER),
inheritance by new children, `tierfs setopt` / `tierfs getopt` and their
errors, and the options honoured now: foreground_target placing a file's
data on the member or group it names, compression compressing it, replicas
putting a copy on each of that many members (shown by `tierfs ctl`).

Two members, ssd.a (the filesystem's foreground target) and hdd.b. Each test
unmounts and runs `tierfs fsck` (Mount.close does). Needs /dev/fuse and root;
the helpers are fusetest.py's."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fusetest import Mount, as_user, expect, image, needs_fuse, two_members
from tierlab.testing import assert_one_line_error, run, tool

pytestmark = needs_fuse

CAP_FOWNER = 3
OPTIONS = ("foreground_target", "background_target", "promote_target", "replicas", "compression")


@pytest.fixture
def fs(tmp_path: Path):
    a, b = two_members(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    m = Mount([a, b], mnt, f"log={log}")
    m.log = log  # type: ignore[attr-defined]
    try:
        yield m
    finally:
        if os.path.ismount(mnt):
            m.close()


def ctl(mnt: Path) -> dict:
    proc = run([tool("tierfs"), "ctl", mnt])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def fg_bytes(doc: dict, label: str) -> int:
    dev = next(d for d in doc["devices"] if d["label"] == label)
    return dev["io"].get("foreground_write", {}).get("write", {}).get("bytes", 0)


def getopt(path: Path) -> dict[str, str]:
    proc = run([tool("tierfs"), "getopt", path])
    assert proc.returncode == 0, proc.stderr
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines())


needs_attr = pytest.mark.skipif(shutil.which("setfattr") is None, reason="needs setfattr/getfattr (Debian: attr)")


@needs_attr
def test_setfattr_and_getfattr_set_and_show_options(fs: Mount) -> None:
    f = fs.mnt / "f"
    f.write_bytes(b"x")
    assert run(["setfattr", "-n", "tierfs.replicas", "-v", "2", f]).returncode == 0
    got = run(["getfattr", "--only-values", "-n", "tierfs.replicas", f])
    assert got.returncode == 0 and got.stdout == "2", got
    assert run(["setfattr", "-n", "tierfs.foreground_target", "-v", "hdd.b", f]).returncode == 0
    dump = run(["getfattr", "-d", "-m", "-", f])
    assert 'tierfs.replicas="2"' in dump.stdout and 'tierfs.foreground_target="hdd.b"' in dump.stdout, dump.stdout
    # Validation: EINVAL to the caller, one line with the reason in the daemon's log.
    for name, value, why in (("tierfs.replicas", "7", "replicas must be 1, 2, 3 or 4"),
                             ("tierfs.foreground_target", "nvme", "names no member or group"),
                             ("tierfs.compression", "lz4", "compression must be none or zstd"),
                             ("tierfs.bogus", "1", "not an option")):
        bad = run(["setfattr", "-n", name, "-v", value, f])
        assert bad.returncode != 0 and "Invalid argument" in bad.stderr, (name, bad.stderr)
        lines = [ln for ln in fs.log.read_text().splitlines() if f'{name}="{value}"' in ln]  # type: ignore[attr-defined]
        assert len(lines) == 1 and why in lines[0] and "refused" in lines[0], lines
    assert run(["getfattr", "--only-values", "-n", "tierfs.replicas", f]).stdout == "2"  # unchanged
    # tierfs.inherited is read-only, and says so.
    expect(errno.EINVAL, lambda: os.setxattr(f, "tierfs.inherited", b"replicas"), "a read-only name")
    lines = [ln for ln in fs.log.read_text().splitlines() if "tierfs.inherited" in ln]  # type: ignore[attr-defined]
    assert len(lines) == 1 and "read-only" in lines[0], lines
    # A name or value holding a newline cannot forge a log line: shown as '?'.
    expect(errno.EINVAL, lambda: os.setxattr(f, "tierfs.x\nforged refusal", b"1\nforged value"), "a bad name")
    log = fs.log.read_text().splitlines()  # type: ignore[attr-defined]
    assert not any(ln.startswith("forged") for ln in log), log
    assert any('tierfs.x?forged refusal="1?forged value"' in ln for ln in log), log
    # A value with its C string's NUL (strlen + 1 bytes) is taken.
    os.setxattr(f, "tierfs.replicas", b"3\0")
    assert os.getxattr(f, "tierfs.replicas") == b"3"
    os.setxattr(f, "tierfs.replicas", b"2")
    # Remove unsets; the os module's calls are the same syscalls.
    assert run(["setfattr", "-x", "tierfs.replicas", f]).returncode == 0
    expect(errno.ENODATA, lambda: os.getxattr(f, "tierfs.replicas"), "an unset option")
    expect(errno.EINVAL, lambda: os.getxattr(f, "tierfs.bogus"), "an unknown option")
    expect(errno.EOPNOTSUPP, lambda: os.setxattr(f, "foo.bar", b"1"), "an unknown namespace")
    assert sorted(os.listxattr(f)) == ["tierfs.foreground_target"]
    os.setxattr(f, "tierfs.compression", b"zstd")
    assert "c" in run(["lsattr", f]).stdout.split()[0]  # chattr +c is the option's mirror
    assert run(["chattr", "-c", f]).returncode == 0
    expect(errno.ENODATA, lambda: os.getxattr(f, "tierfs.compression"), "chattr -c unsets zstd")
    # Directories and symlinks have options too.
    os.symlink("f", fs.mnt / "sl")
    os.setxattr(fs.mnt / "sl", "tierfs.replicas", b"3", follow_symlinks=False)
    assert os.getxattr(fs.mnt / "sl", "tierfs.replicas", follow_symlinks=False) == b"3"
    fs.close()
    m = Mount(fs.dev, fs.mnt)
    assert os.getxattr(f, "tierfs.foreground_target") == b"hdd.b"
    assert os.getxattr(fs.mnt / "sl", "tierfs.replicas", follow_symlinks=False) == b"3"
    m.close()


def test_only_the_owner_or_cap_fowner_sets_options(tmp_path: Path) -> None:
    """chattr's rule. The kernel itself only asks for write access to a
    name outside its namespaces: files everyone may write show posix's own
    check. An allow_other mount where other users can reach it."""
    dev = image(tmp_path / "fs.img")
    mnt = Path(tempfile.mkdtemp(prefix="tierfs-opts-", dir="/tmp"))
    os.chmod(mnt, 0o755)
    log = tmp_path / "daemon.log"
    m = Mount(dev, mnt, "allow_other", f"log={log}")
    try:
        os.chmod(mnt, 0o755)
        root_file = mnt / "root-owned"
        root_file.write_bytes(b"x")
        os.chmod(root_file, 0o666)
        mine = mnt / "mine"
        mine.write_bytes(b"x")
        os.chown(mine, 1000, 1000)
        os.chmod(mine, 0o666)

        def set_replicas(p: Path, v: bytes) -> None:
            os.setxattr(p, "tierfs.replicas", v)

        assert as_user(1000, 1000, lambda: set_replicas(mine, b"2")) is None
        assert as_user(1000, 1000, lambda: set_replicas(root_file, b"2")) == errno.EPERM
        assert as_user(1000, 1000, lambda: os.removexattr(mine, "tierfs.replicas")) is None
        # Root without CAP_FOWNER (it keeps CAP_DAC_OVERRIDE) on another's file.
        assert as_user(0, 0, lambda: set_replicas(mine, b"3"), drop_caps=(CAP_FOWNER,)) == errno.EPERM
        assert as_user(0, 0, lambda: set_replicas(mine, b"3")) is None
        assert os.getxattr(mine, "tierfs.replicas") == b"3"
        # Anyone who may read the file reads them.
        assert as_user(1000, 1000, lambda: os.getxattr(mine, "tierfs.replicas")) == b"3"
        lines = [ln for ln in log.read_text().splitlines() if "refused" in ln]
        assert lines and "only the owner (or CAP_FOWNER)" in lines[0], lines
        # tierfs setopt says so in one line.
        assert_one_line_error(run([tool("tierfs"), "setopt", root_file, "--replicas", "3"],
                                  preexec_fn=lambda: os.setresuid(1000, 1000, 1000)), 1,
                              "only the owner (or CAP_FOWNER)")
        expect(errno.ENODATA, lambda: os.getxattr(root_file, "tierfs.replicas"), "refused: nothing set")
    finally:
        m.close()
        os.rmdir(mnt)


def test_new_children_inherit_a_directorys_options(fs: Mount) -> None:
    d = fs.mnt / "d"
    d.mkdir()
    (d / "before").write_bytes(b"x")
    os.setxattr(d, "tierfs.foreground_target", b"hdd")
    os.setxattr(d, "tierfs.replicas", b"2")
    (d / "file").write_bytes(b"x")
    (d / "sub").mkdir()
    (d / "sub" / "deeper").write_bytes(b"x")
    os.symlink("file", d / "sl")
    os.mkfifo(d / "fifo")
    for p in (d / "file", d / "sub", d / "sub" / "deeper", d / "fifo"):
        assert os.getxattr(p, "tierfs.replicas") == b"2", p
        assert os.getxattr(p, "tierfs.foreground_target") == b"hdd", p
        assert os.getxattr(p, "tierfs.inherited") == b"foreground_target,replicas", p
    assert os.getxattr(d / "sl", "tierfs.replicas", follow_symlinks=False) == b"2"
    assert os.getxattr(d, "tierfs.inherited") == b""
    # Existing children keep what they had; a child's own setting is its own.
    expect(errno.ENODATA, lambda: os.getxattr(d / "before", "tierfs.replicas"), "an existing child")
    os.setxattr(d, "tierfs.replicas", b"4")
    assert os.getxattr(d / "file", "tierfs.replicas") == b"2"
    os.setxattr(d / "file", "tierfs.replicas", b"1")
    assert os.getxattr(d / "file", "tierfs.inherited") == b"foreground_target"
    opts = getopt(d / "sub" / "deeper")
    assert opts == {"foreground_target": "hdd (inherited)", "background_target": "unset",
                    "promote_target": "unset", "replicas": "2 (inherited)", "compression": "unset"}, opts
    fs.close()
    m = Mount(fs.dev, fs.mnt)
    assert getopt(d / "sub" / "deeper") == opts
    m.close()


def test_setopt_and_getopt(fs: Mount, tmp_path: Path) -> None:
    d = fs.mnt / "d"
    d.mkdir()
    assert getopt(d) == {o: "unset" for o in OPTIONS}
    proc = run([tool("tierfs"), "setopt", d, "--foreground-target", "hdd.b", "--background-target", "hdd",
                "--promote-target", "ssd", "--replicas", "2", "--compression", "zstd"])
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc
    assert getopt(d) == {"foreground_target": "hdd.b", "background_target": "hdd", "promote_target": "ssd",
                         "replicas": "2", "compression": "zstd"}
    assert os.getxattr(d, "tierfs.replicas") == b"2"  # the same xattrs
    (d / "f").write_bytes(b"x")
    assert getopt(d / "f")["compression"] == "zstd (inherited)"
    proc = run([tool("tierfs"), "setopt", d, "--unset", "promote_target", "--unset", "background-target",
                "--foreground-target", "none"])
    assert proc.returncode == 0, proc.stderr
    assert getopt(d) == {"foreground_target": "unset", "background_target": "unset", "promote_target": "unset",
                         "replicas": "2", "compression": "zstd"}
    two = run([tool("tierfs"), "getopt", d, d / "f"])
    assert two.returncode == 0 and two.stdout.count("replicas: 2") == 2 and f"{d}:\n" in two.stdout, two.stdout
    # Bad input: one line each, nonzero, nothing changed.
    tierfs = tool("tierfs")
    assert_one_line_error(run([tierfs, "setopt", fs.mnt / "nope", "--replicas", "2"]), 1,
                          "tierfs setopt:", "No such file or directory")
    assert_one_line_error(run([tierfs, "getopt", fs.mnt / "nope"]), 1, "tierfs getopt:", "No such file or directory")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"x")
    assert_one_line_error(run([tierfs, "setopt", elsewhere, "--replicas", "2"]), 1, "not on a tierfs filesystem")
    assert_one_line_error(run([tierfs, "getopt", elsewhere]), 1, "not on a tierfs filesystem")
    assert_one_line_error(run([tierfs, "setopt", d, "--foreground-target", "nvme"]), 1,
                          "--foreground-target 'nvme': names no member or group of this filesystem")
    assert_one_line_error(run([tierfs, "setopt", d, "--replicas", "5"]), 2, "--replicas '5': must be 1, 2, 3 or 4")
    assert_one_line_error(run([tierfs, "setopt", d, "--compression", "lz4"]), 2,
                          "--compression 'lz4': must be none or zstd")
    assert_one_line_error(run([tierfs, "setopt", d]), 2, "nothing to set")
    assert_one_line_error(run([tierfs, "setopt", d, "--unset", "colour"]), 2, "'colour' is not an option")
    assert_one_line_error(run([tierfs, "setopt", d, "--replicas", "3", "--unset", "replicas"]), 2,
                          "both set and unset")
    assert_one_line_error(run([tierfs, "setopt", d, "--bogus", "1"]), 2, "--bogus")
    assert_one_line_error(run([tierfs, "setopt", d, "--unset", "inherited"]), 2, "'inherited' is read-only")
    assert getopt(d)["replicas"] == "2"
    # A path gets all its changes or none: foreground_target is set first,
    # then promote_target is refused, and foreground_target is put back.
    before = getopt(d)
    assert_one_line_error(run([tierfs, "setopt", d, "--foreground-target", "hdd.b", "--promote-target", "nvme",
                               "--replicas", "3"]), 1,
                          "--promote-target 'nvme': names no member or group of this filesystem; nothing changed")
    assert getopt(d) == before
    os.setxattr(d, "tierfs.foreground_target", b"ssd")
    assert_one_line_error(run([tierfs, "setopt", d, "--foreground-target", "hdd", "--unset", "compression",
                               "--background-target", "nvme"]), 1, "nothing changed")
    assert getopt(d) == dict(before, foreground_target="ssd")
    help_ = run([tierfs, "setopt", "--help"])
    assert help_.returncode == 0 and "--foreground-target" in help_.stdout and "--unset" in help_.stdout


def test_foreground_target_and_compression_are_honoured(fs: Mount) -> None:
    d = fs.mnt / "on-hdd"
    d.mkdir()
    os.setxattr(d, "tierfs.foreground_target", b"hdd")
    data = os.urandom(1 << 20)
    before = ctl(fs.mnt)
    (d / "f").write_bytes(data)
    after = ctl(fs.mnt)
    assert fg_bytes(after, "hdd.b") - fg_bytes(before, "hdd.b") >= len(data)
    assert fg_bytes(after, "ssd.a") == fg_bytes(before, "ssd.a")
    (fs.mnt / "plain").write_bytes(data)
    last = ctl(fs.mnt)
    assert fg_bytes(last, "ssd.a") - fg_bytes(after, "ssd.a") >= len(data)
    assert fg_bytes(last, "hdd.b") == fg_bytes(after, "hdd.b")
    # compression=zstd compresses a file's new data; none leaves it plain.
    text = "".join(f"{i}: the quick brown fox jumps over the lazy dog\n" for i in range(20000)).encode()
    z = fs.mnt / "z"
    z.touch()
    os.setxattr(z, "tierfs.compression", b"zstd")
    c0 = ctl(fs.mnt)["data"]
    z.write_bytes(text)
    c1 = ctl(fs.mnt)["data"]
    assert c1["compressed_in"] - c0["compressed_in"] >= len(text) // 2
    assert c1["compressed_in"] - c0["compressed_in"] > 4 * (c1["compressed_out"] - c0["compressed_out"])
    fs.close()
    m = Mount(fs.dev, fs.mnt)
    assert (d / "f").read_bytes() == data and z.read_bytes() == text
    m.close()


def test_replicas_put_a_copy_on_each_member_and_count_degraded_writes(fs: Mount) -> None:
    """replicas=2 on two members: every byte is written to both (the data
    counters and each member's foreground writes say so); replicas=3 on two:
    two copies, the writes counted degraded; both read back, and the mount's
    close runs fsck."""
    data = os.urandom(1 << 20)
    two, three = fs.mnt / "two", fs.mnt / "three"
    for f, n in ((two, b"2"), (three, b"3")):
        f.touch()
        os.setxattr(f, "tierfs.replicas", n)
    before = ctl(fs.mnt)
    two.write_bytes(data)
    after = ctl(fs.mnt)
    for label in ("ssd.a", "hdd.b"):
        assert fg_bytes(after, label) - fg_bytes(before, label) >= len(data), label
    assert after["data"]["replica_copies"] > before["data"]["replica_copies"]
    assert after["data"]["degraded_writes"] == before["data"]["degraded_writes"]
    three.write_bytes(data)
    last = ctl(fs.mnt)
    assert last["data"]["degraded_writes"] > after["data"]["degraded_writes"]
    assert last["data"]["degraded_sectors"] - after["data"]["degraded_sectors"] == len(data) // 512
    assert two.read_bytes() == data and three.read_bytes() == data
