"""Can the wrapper write its state directory? A full disk is a state the wrapper is in, said once, left by itself.

Theory of operation: the wrapper acknowledges a QoS 1/2 publication to its
broker only once its custody spool holds it, and takes a QoS 1/2 copy from a
neighbour only while its injection journal can record it (docs/daemon.md,
"Custody across restarts"). When the disk under the state directory is full
(or the directory is read-only, or the quota is reached) those writes fail.
That is not a crash and not a reason to lose anything: the wrapper stops
taking what it could not keep (its broker keeps the publications it did not
acknowledge, its neighbours the copies it did not acknowledge), keeps
delivering what it has, and tries again every second.

`StorageHealth` is that state, for everyone who must say it: one ERROR line
when writes start failing and one INFO line when they work again (however
many writes fail in between), the readiness reason (`/readyz` not ready,
`wrapper.py status` exits 1), the status document (`daemon.storage`) and the
metrics (`mqttfed_storage_ok`, `mqttfed_storage_write_failures_total`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from typing import Any

log = logging.getLogger("federation.daemon")

PROBE_FILE = ".write-probe"
PROBE_BYTES = 65536
"""what the probe writes: room for a read pass's spool records at least, or it says yes too early"""


def describe_error(error: BaseException) -> str:
    """An OSError in words a person can act on."""
    number = getattr(error, "errno", None)
    if number in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if number == errno.EROFS:
        return "the file system is read-only"
    if number in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return str(getattr(error, "strerror", None) or error)


class StorageHealth:
    """Whether writes to the state directory work; see the module docstring."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.problem: str | None = None
        """why writes fail now (None while they work)"""
        self.since: float | None = None
        """when they started failing (the loop's clock)"""
        self.write_failures = 0
        """writes refused by the file system, since the start"""
        self.episodes = 0
        """times writes started failing"""

    @property
    def ok(self) -> bool:
        return self.problem is None

    def failed(self, what: str, error: BaseException, now: float) -> None:
        """A write of `what` (a file of the state directory) failed: said once per episode."""
        self.write_failures += 1
        if self.problem is not None:
            return
        self.problem = (f"cannot write {what} in the state directory {self.directory}: {describe_error(error)}; new "
                        f"QoS 1/2 publications are not acknowledged until it can (the broker and the neighbours "
                        f"keep them): free space there")
        self.since = now
        self.episodes += 1
        log.error("%s (drop storage_unavailable counts the refusals; retried every second)", self.problem)

    def recovered(self, now: float) -> None:
        """Writes work again."""
        if self.problem is None:
            return
        log.info("the state directory %s can be written again after %.1f s: taking QoS 1/2 publications again",
                 self.directory, now - (self.since if self.since is not None else now))
        self.problem = None
        self.since = None

    def probe(self) -> bool:
        """Does the state directory take a write now? A small file written, synced and removed (the writes that
        failed are retried by their owners only when this says yes)."""
        if self.directory is None:
            return True
        path = os.path.join(self.directory, PROBE_FILE)
        try:
            with open(path, "wb") as handle:
                handle.write(b"\0" * PROBE_BYTES)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True

    def status(self, now: float) -> dict[str, Any]:
        return {"ok": self.ok, "problem": self.problem,
                "seconds": None if self.since is None else round(now - self.since, 1),
                "write_failures": self.write_failures, "episodes": self.episodes}
