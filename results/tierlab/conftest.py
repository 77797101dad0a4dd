"""Fixtures of the VM lab's tests (vmboot_test, vmpair_test, vmlibvirt_test)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tierlab import vmimage
from tierlab.testing import guest_image


@pytest.fixture(scope="module")
def image() -> vmimage.Image:
    """The guest image (skips where QEMU or the image cannot be had)."""
    return guest_image()


@pytest.fixture
def images_dir() -> Iterator[Path]:
    """A directory for member images in /dev/shm, removed after the test."""
    d = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="tierlab-vmtest-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
