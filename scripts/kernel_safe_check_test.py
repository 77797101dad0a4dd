"""The kernel-safe check must reject what a kernel module cannot link, and accept
what it can. Each case compiles a tiny C++ file and feeds the object to the check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_safe_check as ksc  # noqa: E402

CXX = os.environ.get("CXX", "g++")
SCRIPT = Path(__file__).resolve().parent / "kernel_safe_check.py"


def compile_hosted(tmp_path: Path, name: str, code: str, extra: list[str] | None = None) -> Path:
    """Compiles with kernel code-generation flags but WITH the standard headers, the
    way a careless change would look after someone removed -nostdinc."""
    src = tmp_path / f"{name}.cc"
    src.write_text(code)
    obj = tmp_path / f"{name}.o"
    flags = [f for f in ksc.KERNEL_FLAGS if f not in ("-nostdinc", "-ffreestanding", "-Werror")]
    flags = [f for f in flags if not f.startswith("-mno-") and f != "-mcmodel=kernel"]
    subprocess.run([CXX, *flags, *(extra or []), "-c", str(src), "-o", str(obj)], check=True)
    return obj


def run_check(*objs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "check", *map(str, objs)],
                          capture_output=True, text=True)


def test_accepts_seam_only_object(tmp_path: Path) -> None:
    obj = compile_hosted(tmp_path, "clean", """
        extern "C" void* tfs_plat_alloc(unsigned long, unsigned long, unsigned);
        extern "C" void tfs_plat_free(void*);
        void* Copy(const void* src, unsigned long n) {
          void* p = tfs_plat_alloc(n, 16, 0);
          if (p) __builtin_memcpy(p, src, n);
          return p;
        }
        void Release(void* p) { tfs_plat_free(p); }
    """)
    res = run_check(obj)
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout


def test_rejects_std_vector(tmp_path: Path) -> None:
    obj = compile_hosted(tmp_path, "vec", """
        #include <vector>
        int Sum(int n) {
          std::vector<int> v;
          for (int i = 0; i < n; i++) v.push_back(i);
          int s = 0;
          for (int x : v) s += x;
          return s;
        }
    """)
    res = run_check(obj)
    assert res.returncode == 1
    # operator new / delete and the length_error thrower are outside the seam.
    assert "operator new" in res.stderr
    assert "outside the seam" in res.stderr
    assert "FAILED" in res.stderr


def test_rejects_static_constructor(tmp_path: Path) -> None:
    obj = compile_hosted(tmp_path, "ctor", """
        extern "C" unsigned long tfs_plat_now_ns();
        struct Clock { unsigned long start; Clock() : start(tfs_plat_now_ns()) {} };
        Clock g_clock;
        unsigned long Start() { return g_clock.start; }
    """)
    res = run_check(obj)
    assert res.returncode == 1
    assert ".init_array" in res.stderr and "static constructor" in res.stderr


def test_rejects_thread_local(tmp_path: Path) -> None:
    obj = compile_hosted(tmp_path, "tls", """
        thread_local int t_counter;
        int Bump() { return ++t_counter; }
    """)
    res = run_check(obj)
    assert res.returncode == 1
    assert "thread" in res.stderr


def test_rejects_rtti_and_exceptions(tmp_path: Path) -> None:
    obj = compile_hosted(tmp_path, "rtti", """
        struct Base { virtual ~Base(); virtual int F() { return 1; } };
        struct Derived : Base { int F() override { return 2; } };
        Base::~Base() {}
        int Probe(Base* b) {
          if (dynamic_cast<Derived*>(b)) throw 42;
          return b->F();
        }
    """, extra=["-frtti", "-fexceptions"])
    res = run_check(obj)
    assert res.returncode == 1
    assert "C++ runtime symbol" in res.stderr
    assert "__cxa_" in res.stderr or "_ZTI" in res.stderr


def test_symbol_defined_in_another_object_is_fine(tmp_path: Path) -> None:
    user = compile_hosted(tmp_path, "user", "int Helper(int); int Use(int x) { return Helper(x) + 1; }")
    helper = compile_hosted(tmp_path, "helper", "int Helper(int x) { return x * 2; }")
    assert run_check(user).returncode == 1  # alone, Helper is an unknown symbol
    res = run_check(user, helper)
    assert res.returncode == 0, res.stderr


def test_build_mode_rejects_system_header(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    (root / "util").mkdir(parents=True)
    (root / "util" / "bad.cc").write_text("#include <vector>\nint F() { return 0; }\n")
    (root / "sources.list").write_text("# test\nutil/bad.cc\n")
    res = subprocess.run([sys.executable, str(SCRIPT), "build", "--sources", str(root / "sources.list"),
                          "--out", str(tmp_path / "obj")], capture_output=True, text=True)
    assert res.returncode == 1
    assert "does not compile with kernel flags" in res.stderr
    assert "vector" in res.stderr


def test_build_mode_rejects_a_frame_over_the_kernels_limit(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    (root / "util").mkdir(parents=True)
    # 2 KiB of buffer plus the frame's own bytes: over the kernel's 2048.
    (root / "util" / "big.cc").write_text(
        "void Use(char* p);\nvoid F() { char buf[2048]; Use(buf); }\n"
        "void G() { char buf[1900]; Use(buf); }\n")
    (root / "sources.list").write_text("util/big.cc\n")
    res = subprocess.run([sys.executable, str(SCRIPT), "build", "--sources", str(root / "sources.list"),
                          "--out", str(tmp_path / "obj")], capture_output=True, text=True)
    assert res.returncode == 1
    assert "frame size" in res.stderr and "'void F()'" in res.stderr.replace("‘", "'").replace("’", "'")
    assert "void G()" not in res.stderr  # under the limit


def test_build_mode_rejects_missing_listed_source(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    root.mkdir()
    (root / "sources.list").write_text("util/missing.cc\n")
    res = subprocess.run([sys.executable, str(SCRIPT), "build", "--sources", str(root / "sources.list"),
                          "--out", str(tmp_path / "obj")], capture_output=True, text=True)
    assert res.returncode != 0
    assert "does not exist" in res.stderr


def test_check_mode_missing_object_is_usage_error(tmp_path: Path) -> None:
    res = run_check(tmp_path / "nope.o")
    assert res.returncode == 2
    assert "no such file" in res.stderr


@pytest.mark.parametrize("name", ["memcpy", "memset", "memmove", "memcmp", "__stack_chk_fail",
                                  "tfs_plat_wait"])
def test_allow_list(name: str) -> None:
    assert ksc.allowed(name)


@pytest.mark.parametrize("name", ["malloc", "strlen", "_Znwm", "printf", "pthread_mutex_lock"])
def test_not_allowed(name: str) -> None:
    assert not ksc.allowed(name)
