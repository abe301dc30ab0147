"""Shared-memory segments for KV block bytes between the kvmanager and the executor.

The kvmanager creates a segment and names it in a gRPC call; the executor maps it by that
name and exports blocks into it (or imports them from it). The bytes never enter protobuf.

A segment is a POSIX shared-memory object, i.e. a file under ``/dev/shm`` on Linux, mapped
with ``mmap``. ``multiprocessing.shared_memory`` is not used on purpose: before Python 3.13
every process that *attaches* registers the segment with its resource tracker, which unlinks
it when that process exits and warns about a "leak" it does not own. Names carry the
creator's pid, so segments left behind by a crashed creator are found and removed
(``remove_stale``). Both processes must share the host's (or the container's) ``/dev/shm``.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import secrets
from pathlib import Path

import torch

SHM_DIR = Path(os.environ.get("LENSERVE_SHM_DIR", "/dev/shm"))
PREFIX = "lenserve-kv-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")


class SegmentError(ValueError):
    """A segment name that is not ours, a segment that does not exist or is too small."""


class Segment:
    """One mapped segment. ``blocks(shape, dtype)`` is a tensor view of its first bytes."""

    def __init__(self, name: str, fd: int, size: int, owner: bool):
        self.name, self.size, self.owner = name, size, owner
        self._fd = fd
        self._map = mmap.mmap(fd, size) if size else None
        self._bytes = (torch.frombuffer(self._map, dtype=torch.uint8) if size
                       else torch.empty(0, dtype=torch.uint8))

    def blocks(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if nbytes > self.size:
            raise SegmentError(f"shared memory segment {self.name!r} holds {self.size} bytes, "
                               f"{tuple(shape)} {dtype} needs {nbytes}")
        return self._bytes[:nbytes].view(dtype).view(shape)

    def unlinked(self) -> bool:
        """The creator removed the name: the mapping only keeps memory alive now."""
        return os.fstat(self._fd).st_nlink == 0

    def close(self) -> None:
        """Unmaps once no tensor view is left (views keep the memory valid until then)."""
        if self.owner:
            (SHM_DIR / self.name).unlink(missing_ok=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._bytes = None
        self._map = None


def create(size: int) -> Segment:
    """A new segment of ``size`` bytes, readable and writable by this user only."""
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return Segment(name, fd, size, owner=True)
    except BaseException:
        os.close(fd)
        (SHM_DIR / name).unlink(missing_ok=True)
        raise


def attach(name: str) -> Segment:
    """Map an existing segment by name; SegmentError if the name is not a lenserve segment's
    or nothing has it."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SegmentError(f"{name!r} is not a lenserve shared memory segment name "
                           f"({PREFIX}PID-HEX)")
    try:
        fd = os.open(SHM_DIR / name, os.O_RDWR)
    except FileNotFoundError:
        raise SegmentError(f"no shared memory segment {name!r} (the kvmanager and the "
                           f"executor must share {SHM_DIR})") from None
    return Segment(name, fd, os.fstat(fd).st_size, owner=False)


def remove_stale() -> list[str]:
    """Remove segments whose creating process is gone; the names removed. Call it before this
    process creates any: one with this process's own pid is stale too (a restarted container
    often gets the pid its predecessor had)."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        match = _NAME.match(path.name)
        pid = int(match.group(1)) if match else None
        if pid is not None and (pid == os.getpid() or not _alive(pid)):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
