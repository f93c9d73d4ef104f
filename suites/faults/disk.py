"""A full disk for one wrapper: its state directory on a small tmpfs of its own, filled and freed on demand.

Theory of operation: the wrapper keeps what it must not lose in its state
directory (the custody spool, the injection journal, the state file:
docs/daemon.md). To take that space away from one wrapper and nothing else,
the suite mounts a tmpfs of `SIZE_MIB` on each wrapper's state directory
before the wrapper starts (`SmallStateDirs.mount`), fills one with a file
until the kernel says ENOSPC (`fill`), and deletes the file to give the
space back (`free`). A tmpfs, not a loop device: nothing to format, no block
device left behind, and its size is enforced by the kernel exactly as a full
disk's. The mounts are undone when the setup stops (`unmount_all`, also at
exit); `leftover_mounts` finds those of a run killed with SIGKILL.

Needs root (mount); nothing leaves the machine.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import subprocess
from pathlib import Path

from federation.harness.processes import LaunchError

SIZE_MIB = 64
"""each wrapper's state directory: enough for a case's spool and journal, small enough to fill in a moment"""
FILLER = ".faults-filler"
"""the file that takes the space (in the state directory itself)"""
CHUNK = 1024 * 1024
MOUNT_MARK = "mqf_faults_state"
"""the tmpfs source name the suite mounts with (`mount -t tmpfs mqf_faults_state ...`): how its mounts are found"""


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LaunchError(f"{' '.join(command)} failed: {result.stderr.strip() or result.returncode}; "
                          f"the full-disk cases need root (mount)")


class SmallStateDirs:
    """tmpfs mounts on wrappers' state directories, each `size_mib` large."""

    def __init__(self, size_mib: int = SIZE_MIB) -> None:
        self.size_mib = size_mib
        self.mounted: list[Path] = []
        self._registered = False

    def mount(self, directory: Path) -> None:
        """A fresh, empty tmpfs of `size_mib` on `directory` (made if missing)."""
        directory.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m,mode=0700", MOUNT_MARK, str(directory)])
        self.mounted.append(directory)
        if not self._registered:
            atexit.register(self.unmount_all)
            self._registered = True

    def unmount_all(self) -> None:
        """Undo every mount (lazily, so a wrapper still holding a file there does not keep it). Never raises."""
        while self.mounted:
            directory = self.mounted.pop()
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def fill(directory: Path) -> int:
    """Write a file into `directory` until its file system is full; returns the bytes written."""
    written = 0
    block = b"\0" * CHUNK
    with open(directory / FILLER, "ab") as handle:
        while True:
            try:
                written += handle.write(block)
                handle.flush()
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
        with contextlib.suppress(OSError):
            os.fsync(handle.fileno())
    # What the page cache still held may not fit either: small writes after it must fail as well.
    with contextlib.suppress(OSError), open(directory / (FILLER + ".tail"), "ab") as tail:
        while True:
            tail.write(b"\0" * 4096)
            tail.flush()
    return written


def free(directory: Path) -> None:
    """Give the space back."""
    for name in (FILLER, FILLER + ".tail"):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()


def leftover_mounts() -> list[str]:
    """Mount points of the suite's tmpfs still mounted (a run killed with SIGKILL)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[1] for line in lines if line.split()[:1] == [MOUNT_MARK]]
