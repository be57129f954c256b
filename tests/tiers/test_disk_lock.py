"""One writer per arena: a second opener (a real second process, or this one) is refused
with one line naming the path and the holder's pid, and the lock goes with the holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kvoffload
from kvoffload.testing.tiers import conformance_key
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier

SLOT = 4096
CAPACITY = 8 * (HEADER_BYTES + SLOT)

# A second process: opens the tier at argv[1], stores one record, says "ready", and holds
# the tier until its stdin closes (or it is killed). A refusal is printed and exits 3.
_CHILD = f"""
import sys
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.disk import DiskTier
memory = BytearraySlotMemory({SLOT}, 1)
try:
    tier = DiskTier(memory, sys.argv[1], {CAPACITY}, namespace="ns")
except ValueError as exc:
    print("refused:", exc, flush=True)
    sys.exit(3)
tier.submit_put([b"from-the-child"], [0])
tier.drain(10.0)
assert all(r.all_ok for r in tier.poll())
print("ready", flush=True)
sys.stdin.read()
tier.close()
"""


def _child(path: Path) -> subprocess.Popen[str]:
    src = str(Path(kvoffload.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _open(path: Path, namespace: str = "ns") -> DiskTier:
    return DiskTier(BytearraySlotMemory(SLOT, 1), path, CAPACITY, namespace=namespace)


def test_a_second_process_on_the_same_directory_is_refused_naming_the_holder(
    tmp_path: Path,
) -> None:
    child = _child(tmp_path)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(ValueError, match="in use by pid") as refused:
            _open(tmp_path)
        message = str(refused.value)
        assert "\n" not in message
        assert f"pid {child.pid}" in message
        assert str(tmp_path) in message
        assert type(refused.value).__name__ == "DiskTierInUseError"
        _open(tmp_path, namespace="other").close()  # another namespace: another arena
        child.send_signal(signal.SIGKILL)  # the kernel drops a dead holder's lock
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    tier = _open(tmp_path)
    assert tier.contains([b"from-the-child"])[0].value == "hit"  # its record survived
    # now this process holds it: a second process is refused, naming our pid
    other = _child(tmp_path)
    out, _err = other.communicate(timeout=60)
    assert other.returncode == 3, out + _err
    assert f"in use by pid {os.getpid()}" in out and str(tmp_path) in out
    # ... and so is a second tier in this process
    with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
        _open(tmp_path)
    tier.submit_put([conformance_key(1)], [0])
    tier.drain(10.0)
    tier.close()  # releases the lock: the next process opens and sees both records
    last = _child(tmp_path)
    try:
        assert last.stdout is not None and last.stdout.readline().strip() == "ready"
    finally:
        last.communicate(input="", timeout=60)
    assert last.returncode == 0
    reopened = _open(tmp_path)
    assert reopened.stats()["records"] == 2
    reopened.close()
