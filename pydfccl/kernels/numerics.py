"""Conversions for the 16-bit float types, done the way NCCL reduces them.

NCCL reduces half and bfloat16 element by element: each combine computes in float and
rounds the result back to the 16-bit type (round to nearest even) before it goes on. The
movers do the same with the functions here: ``widen`` both operands to float32, apply the
op, ``narrow`` the result. float32 has more than twice the precision of either type plus
two bits (24 >= 2 * 11 + 2), so one float32 add, multiply or divide followed by one rounding
gives exactly the 16-bit type's own IEEE result (no double-rounding error).

float16 is a Numba type (``np.float16`` arrays; the casts are ``cvt.f32.f16`` and
``cvt.rn.f16.f32``). bfloat16 is not: the daemon keeps it as uint16 bit patterns and
converts with integer operations on the float32 bits. Reinterpreting bits as a float is the
only part that differs between a GPU (an LLVM ``bitcast``) and the simulator (a numpy view),
so it is the only part with two versions; the rest is written once.
"""

import numpy as np
from numba import cuda, types

from .memory import SIMULATOR

__all__ = ["float32_bits", "float32_from_bits", "float16_to_float32", "float32_to_float16",
           "bfloat16_to_float32", "float32_to_bfloat16"]

if SIMULATOR:
    def float32_bits(x):
        """The bits of ``x`` as a float32, as an int64 in [0, 2**32)."""
        return int(np.array(x, np.float32).view(np.uint32))

    def float32_from_bits(bits):
        """The float32 whose bits are the low 32 bits of ``bits``."""
        return np.array(int(bits) & 0xFFFFFFFF, np.uint32).view(np.float32)[()]

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def float32_bits(typingctx, x):
        """The bits of ``x`` as a float32, as an int64 in [0, 2**32)."""
        def codegen(context, builder, sig, args):
            value = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.zext(builder.bitcast(value, ir.IntType(32)), ir.IntType(64))

        return types.int64(x), codegen

    @intrinsic
    def float32_from_bits(typingctx, bits):
        """The float32 whose bits are the low 32 bits of ``bits``."""
        def codegen(context, builder, sig, args):
            value = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(value, ir.FloatType())

        return types.float32(bits), codegen


@cuda.jit(device=True)
def float16_to_float32(h):
    return np.float32(h)


@cuda.jit(device=True)
def float32_to_float16(x):
    """Round to nearest even (IEEE conversion)."""
    return np.float16(x)


@cuda.jit(device=True)
def bfloat16_to_float32(bits):
    """bfloat16 is float32's upper half: put the 16 bits back on top (exact)."""
    return float32_from_bits(np.int64(bits) << 16)


@cuda.jit(device=True)
def float32_to_bfloat16(x):
    """The bfloat16 bits nearest ``x`` (ties to even); a NaN stays a (quiet) NaN, and
    values past bfloat16's largest round to infinity, as the rounding carries into the
    exponent."""
    bits = float32_bits(x)
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16((bits >> 16) | 0x0040)
    return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
