"""Read the framed record files written by wandb (``run-*.wandb``) and SwanLab (``run-*.swanlab``).

Both use the LevelDB log layout: a 7-byte file header, then 32 KiB blocks of chunks, each with a
7-byte header (CRC32 ``<I``, length ``<H``, type ``B``: 1 full, 2 first, 3 middle, 4 last).
"""

from __future__ import annotations

import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_chunks(path: Path) -> list[bytes]:
    """The payloads of every record in the file, in order."""
    data = Path(path).read_bytes()
    position, records, pending = HEADER, [], b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # block trailer padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        if kind == 0 and length == 0:  # zero padding up to the end of the block
            position += left
            continue
        payload = data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind == FULL:
            records.append(payload)
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            records.append(pending + payload)
        else:
            raise ValueError(f"unknown chunk type {kind} at byte {position} of {path}")
    return records
