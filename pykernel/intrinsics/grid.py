"""`pk.grid_sync()`: a barrier of every thread of the grid (CUDA's cooperative groups
`this_grid().sync()`). The kernel is launched cooperatively (the runtime sees "grid_sync" in
the compiled kernel's uses): the driver refuses a grid whose blocks cannot all be resident at
once, which would otherwise wait for ever. The target's form: targets/nvptx_intrinsics.py
(a counter in global memory), targets/cpu_intrinsics.py (the grid's blocks as one cluster of
coroutines)."""
from __future__ import annotations

from ..lower.values import ConstValue
from .base import args_of, intrinsic


@intrinsic("grid_sync")
def grid_sync(fl, node):
    """`pk.grid_sync()`: every thread of every block meets here; global-memory writes before
    it are visible to the whole grid after it."""
    args_of(fl, node, 0, "grid_sync")
    fl.ctx.uses.update(("barrier", "grid_sync"))
    site = fl.ctx.site(fl, node, "grid_sync")
    if not fl.ctx.target.has_intrinsic("grid_sync"):
        raise fl.error(node, "pk.grid_sync() has no form on this target")
    fl.ctx.target.lower_intrinsic("grid_sync", fl, node, site)
    return ConstValue(None)
