"""What a cubin records about a kernel's resources, read without CUDA's tools.

A cubin is an ELF file; its ``.nv.info`` section holds, per function, the registers a
thread uses (``EIATTR_REGCOUNT``) and its stack frame (``EIATTR_FRAME_SIZE``), where
ptxas puts what it spills when the register cap is too tight for the code. The daemon
runs under a cap (``kernels.limits.register_cap``), so a change to its device code can
trade registers for a larger frame, slower in every step: ``build-kernels`` prints both
and a test holds the shipped daemons to their figures.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["KernelResources", "kernel_resources"]

_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F


@dataclass(frozen=True)
class KernelResources:
    registers: int       # per thread
    frame_bytes: int     # per thread's stack frame (spills and local arrays)


def _sections(image: bytes) -> dict:
    """{name: (type, offset, size)} of an ELF64 little-endian image."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF image (a cubin)")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize)
               for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name, kind, _, _, offset, size, *_ in headers:
        end = image.index(b"\0", names_at + name)
        out[image[names_at + name:end].decode()] = (kind, offset, size)
    return out


def _symbol_index(image: bytes, sections: dict, name: str) -> int:
    """The index of symbol ``name`` in the image's symbol table."""
    _, offset, size = sections[".symtab"]
    strtab = sections[".strtab"][1]
    wanted = name.encode()
    for i in range(size // 24):         # Elf64_Sym: name, info, other, shndx, value, size
        at, = struct.unpack_from("<I", image, offset + 24 * i)
        end = image.index(b"\0", strtab + at)
        if image[strtab + at:end] == wanted:
            return i
    raise KeyError(f"no symbol {name!r} in the cubin")


def _attributes(image: bytes, offset: int, size: int):
    """Each (attribute, value bytes) of an ``.nv.info`` section."""
    i, end = offset, offset + size
    while i < end:
        fmt, attr = image[i], image[i + 1]
        i += 2
        if fmt == _EIFMT_SVAL:
            n, = struct.unpack_from("<H", image, i)
            yield attr, image[i + 2:i + 2 + n]
            i += 2 + n
        elif fmt == _EIFMT_HVAL:
            yield attr, image[i:i + 2]
            i += 2
        elif fmt == _EIFMT_BVAL:
            yield attr, image[i:i + 1]
            i += 1
        elif fmt != _EIFMT_NVAL:
            raise ValueError(f"unknown .nv.info record format {fmt}")


def kernel_resources(image: bytes, entry: str) -> KernelResources:
    """The registers and stack frame that the cubin ``image`` records for ``entry``."""
    sections = _sections(image)
    if ".nv.info" not in sections:
        raise ValueError("the cubin has no .nv.info section")
    symbol = _symbol_index(image, sections, entry)
    found = {}
    _, offset, size = sections[".nv.info"]
    for attr, value in _attributes(image, offset, size):
        if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(value) == 8:
            function, number = struct.unpack("<II", value)
            if function == symbol:
                found[attr] = number
    if _EIATTR_REGCOUNT not in found:
        raise KeyError(f"the cubin records no register count for {entry!r}")
    return KernelResources(found[_EIATTR_REGCOUNT], found.get(_EIATTR_FRAME_SIZE, 0))
