"""Device code: every ``@cuda.jit`` function of pydfccl lives in this package.

``memory`` is the portability layer (GPU intrinsics or simulator twins), with ``numerics``
its float16/bfloat16 conversions; ``primitives`` the wait loop and the generic data move;
``ring`` the ring all-reduce step plan; ``daemon`` the persistent kernel that schedules
collectives.
"""
