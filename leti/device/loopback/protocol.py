"""The ADB transport protocol as a device speaks it (AOSP ``packages/modules/adb/protocol.txt``).

A message is a 24-byte little-endian header ``command, arg0, arg1, data_length, data_check, magic``
(``magic = command ^ 0xffffffff``; ``data_check`` is the byte sum of the payload, which peers of version
0x01000001 and later no longer verify) followed by ``data_length`` payload bytes.
"""

from __future__ import annotations

import socket
import struct

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_AUTH = 0x48545541
A_STLS = 0x534C5453
NAMES = {A_SYNC: "SYNC", A_CNXN: "CNXN", A_OPEN: "OPEN", A_OKAY: "OKAY", A_CLSE: "CLSE", A_WRTE: "WRTE",
         A_AUTH: "AUTH", A_STLS: "STLS"}

A_VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
_HEADER = struct.Struct("<6I")

# shell protocol v2 packet ids (``shell_protocol.h``)
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN, SHELL_WINDOW = range(6)


class ProtocolError(Exception):
    pass


def pack(command: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    return _HEADER.pack(command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, command ^ 0xFFFFFFFF) + data


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def read_message(sock: socket.socket) -> tuple[int, int, int, bytes]:
    command, arg0, arg1, length, _check, magic = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic for command {command:#x}")
    if length > 16 * 2**20:
        raise ProtocolError(f"payload of {length} bytes is too large")
    return command, arg0, arg1, _read_exact(sock, length) if length else b""


def shell_packet(kind: int, data: bytes) -> bytes:
    return struct.pack("<BI", kind, len(data)) + data
