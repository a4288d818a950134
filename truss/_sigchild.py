"""The helper process of ``truss._sigcheck``: Ed25519 checks, one frame in, one byte out.

Started as ``python -I truss/_sigchild.py`` with its stdin and stdout on private pipes; it imports
the libsodium bindings and nothing of Truss. Each frame on stdin is

    count (1 byte, 1-255) || message length (4 bytes, big-endian) || count public keys (32 bytes
    each) || signature (64 bytes) || message

and for each frame, in order, it writes one byte: the frame's number modulo 128 shifted left by
one, plus 1 when one of the keys verifies the signature of the message (libsodium's
``crypto_sign_open``, as ``truss.ledger.keys`` calls it). It holds public keys and signed bytes
only. A frame it cannot read, or the end of its stdin, ends it. A thread reads stdin as it comes,
so the writer's pipe does not fill while a check runs. A second pipe (its file descriptor is the
one argument) carries the reader's notes "I checked the frames before n myself" (8 bytes each):
those frames are answered 0 unchecked, which the reader takes as "no answer", so the helper does
not spend its time behind the reader.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Any

_HEAD = 5
_KEY = 32
_SIG = 64
_CHUNK = 1 << 20


def _reader(fd: int, chunks: queue.SimpleQueue[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            data = b""
        chunks.put(data)
        if not data:
            return


def _skips(fd: int, skip: list[int]) -> None:
    """Follow the reader's "checked up to frame n myself" notes (8 bytes each, big-endian)."""
    held = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            return
        if not data:
            return
        held += data
        whole = len(held) - len(held) % 8
        for at in range(0, whole, 8):
            skip[0] = max(skip[0], int.from_bytes(held[at : at + 8], "big"))
        held = held[whole:]


def main() -> int:
    import importlib

    sodium: Any = importlib.import_module("nacl._sodium")
    if sodium.lib.sodium_init() < 0:
        return 2
    ffi, open_signed = sodium.ffi, sodium.lib.crypto_sign_open
    opened: Any = ffi.new("unsigned char[]", 1 << 16)  # the output crypto_sign_open needs, grown on demand
    opened_len: Any = ffi.new("unsigned long long *")
    chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_reader, args=(sys.stdin.fileno(), chunks), daemon=True).start()
    skip = [0]
    if len(sys.argv) > 1:
        threading.Thread(target=_skips, args=(int(sys.argv[1]), skip), daemon=True).start()
    out = sys.stdout.fileno()
    buffer = bytearray()
    at = 0
    number = 0
    while True:
        data = chunks.get()
        if not data:
            return 0
        buffer += data
        while len(buffer) - at >= _HEAD:
            count = buffer[at]
            length = int.from_bytes(buffer[at + 1 : at + _HEAD], "big")
            if count == 0:
                return 3
            end = at + _HEAD + count * _KEY + _SIG + length
            if end > len(buffer):
                break
            keys = at + _HEAD
            ok = 0  # also the answer for a frame the reader checked itself (skipped): "check it there"
            if number >= skip[0]:
                signed = bytes(buffer[keys + count * _KEY : end])  # signature || message, as crypto_sign_open takes it
                if len(signed) > len(opened):
                    opened = ffi.new("unsigned char[]", len(signed))
                for n in range(count):
                    key = bytes(buffer[keys + n * _KEY : keys + (n + 1) * _KEY])
                    if open_signed(opened, opened_len, signed, len(signed), key) == 0:
                        ok = 1
                        break
            os.write(out, bytes(((number & 0x7F) << 1 | ok,)))  # at once: the reader may be waiting for it
            number += 1
            at = end
        del buffer[:at]
        at = 0


if __name__ == "__main__":
    sys.exit(main())
