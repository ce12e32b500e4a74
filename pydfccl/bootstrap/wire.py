"""What the bootstrap sends between ranks: plain data as JSON, never pickle.

A pickle runs code when it is read, so anyone who can reach a store's port could run code
as a rank. The bootstrap only ever exchanges plain data (registrations, segment names,
CUDA IPC handles), so it takes JSON with a few tags for what JSON lacks: bytes, tuples and
dicts with non-string keys. Anything else is refused when sent, with its type named.

Frames on a socket are a 4-byte big-endian length and that many bytes, at most
``MAX_FRAME``; ``recv_frame`` refuses longer ones before reading them.
"""

from __future__ import annotations

import base64
import json
import socket
import struct

__all__ = ["encode", "decode", "to_plain", "from_plain", "send_frame", "recv_frame",
           "MAX_FRAME", "WireError"]

MAX_FRAME = 16 << 20
_LENGTH = struct.Struct(">I")


class WireError(ValueError):
    """A message that is not what the bootstrap sends: too long, not JSON, or a tag that
    does not decode."""


def to_plain(obj):
    """``obj`` as JSON-ready data, with bytes, tuples and non-string keys tagged."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"#bytes": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, tuple):
        return {"#tuple": [to_plain(v) for v in obj]}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("#") for k in obj):
            return {k: to_plain(v) for k, v in obj.items()}
        return {"#items": [[to_plain(k), to_plain(v)] for k, v in obj.items()]}
    if getattr(obj, "shape", None) == () and callable(getattr(obj, "item", None)):
        return to_plain(obj.item())                    # a numpy scalar
    raise TypeError(f"the bootstrap sends plain data only (None, bool, int, float, str, "
                    f"bytes, list, tuple, dict), not {type(obj).__name__}")


def from_plain(data):
    """The inverse of ``to_plain``."""
    if isinstance(data, list):
        return [from_plain(v) for v in data]
    if isinstance(data, dict):
        if len(data) == 1:
            (tag, value), = data.items()
            try:
                if tag == "#bytes":
                    return base64.b64decode(value.encode(), validate=True)
                if tag == "#tuple":
                    return tuple(from_plain(v) for v in value)
                if tag == "#items":
                    return {_key(from_plain(k)): from_plain(v) for k, v in value}
            except (TypeError, ValueError, AttributeError) as exc:
                raise WireError(f"a {tag} tag that does not decode: {exc}") from None
        return {k: from_plain(v) for k, v in data.items()}
    return data


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def encode(obj) -> bytes:
    return json.dumps(to_plain(obj), separators=(",", ":")).encode()


def decode(raw: bytes):
    try:
        return from_plain(json.loads(raw.decode()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"not a bootstrap message: {exc}") from None


def send_frame(sock: socket.socket, payload: bytes) -> None:
    if len(payload) > MAX_FRAME:
        raise WireError(f"a message of {len(payload)} bytes, more than {MAX_FRAME}")
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME) -> bytes:
    (length,) = _LENGTH.unpack(recv_exactly(sock, _LENGTH.size))
    if length > limit:
        raise WireError(f"a frame of {length} bytes announced, more than {limit}")
    return recv_exactly(sock, length)
