"""Plain-file sink: atomic replacement so a reader never sees half a file.

The text goes to ``.<name>.tmp`` in the same directory (a dot file: dnsmasq's ``--hostsdir``
ignores it, and the rename stays within one file system), is fsynced, renamed over the
target, and the directory is fsynced so the rename survives a crash. Nothing is written
when the file already holds the same text.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from coredns_hosts.model import SinkError


class FileSink:
    name = "file"

    def __init__(self, path: Path, *, mode: int = 0o644) -> None:
        self.path = path
        self.tmp_path = path.with_name(f".{path.name}.tmp")
        self.mode = mode

    def _current(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {self.path}: {exc.strerror}") from None

    async def write(self, text: str) -> bool:
        return await asyncio.to_thread(self._write, text)

    async def close(self) -> None:
        return None

    def _write(self, text: str) -> bool:
        data = text.encode("utf-8")
        if self._current() == data:
            return False
        try:
            fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.mode)
        except OSError as exc:
            raise SinkError(
                f"cannot write {self.path}: {exc.strerror} (on {self.tmp_path}); "
                "last good file kept"
            ) from None
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, self.mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp_path)
            raise SinkError(
                f"cannot write {self.path}: {exc.strerror}; last good file kept"
            ) from None
        self._fsync_dir()
        return True

    def _fsync_dir(self) -> None:
        try:
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)
