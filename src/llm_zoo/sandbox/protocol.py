"""Frames between the host and a sandbox server (standard library only; runs on both sides).

A frame is a 4-byte big-endian length, a JSON header, then the raw byte blobs whose lengths the
header lists under ``"blobs"``. Nothing is pickled, so the host never deserialises code from the
server's side.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Sequence

MAX_HEADER_BYTES = 1 << 20


def write_frame(fd: int, header: dict, blobs: Sequence[bytes] = ()) -> None:
    """Write one frame (header + blobs) to ``fd``, retrying partial writes."""
    head = json.dumps(dict(header, blobs=[len(blob) for blob in blobs])).encode()
    view = memoryview(b"".join([struct.pack(">I", len(head)), head, *blobs]))
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, size: int, deadline: float | None = None) -> bytes | None:
    """Read exactly ``size`` bytes; ``None`` at end of file; ``TimeoutError`` past ``deadline``."""
    chunks, missing = [], size
    while missing:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no answer before the deadline")
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> tuple[dict, list[bytes]] | None:
    """Read one frame; ``None`` if the other side closed the pipe first."""
    size = read_exact(fd, 4, deadline)
    if size is None:
        return None
    (head_size,) = struct.unpack(">I", size)
    if head_size > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {head_size} bytes")
    head = read_exact(fd, head_size, deadline)
    if head is None:
        return None
    header = json.loads(head)
    blobs = []
    for blob_size in header.pop("blobs"):
        blob = read_exact(fd, int(blob_size), deadline)
        if blob is None:
            return None
        blobs.append(blob)
    return header, blobs
