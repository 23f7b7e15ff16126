"""The VM's instructions, one file per family; :data:`INSTRUCTIONS` lists them all."""

from lowvm.instructions.atomic import ATOMIC_TYPES, Arrive, AtomicAdd
from lowvm.instructions.base import INSTRUCTIONS, Instruction
from lowvm.instructions.control import Sync, WaitPriorGrid
from lowvm.instructions.data import (
    Assign,
    Cast,
    Extract,
    Permute,
    RegisterInit,
    ThreadIndex,
    View,
)
from lowvm.instructions.dot import DOT_TYPES, Dot, DotShared, DotWait
from lowvm.instructions.elementwise import COMPARISONS, OPS, Elementwise
from lowvm.instructions.mbarrier import (
    AllocBarriers,
    MbarrierArrive,
    MbarrierExpectTx,
    MbarrierWait,
)
from lowvm.instructions.memory import (
    AllocShared,
    CommitGroup,
    CopyAsync,
    FreeShared,
    GlobalView,
    LoadGlobal,
    LoadShared,
    PrefetchL2,
    StoreGlobal,
    StoreShared,
    WaitGroup,
)
from lowvm.instructions.reduce import REDUCE_OPS, Reduce
from lowvm.instructions.tma import CopyBulk, CopyTma, StoreTma, StoreTmaWait

__all__ = [
    "ATOMIC_TYPES",
    "AtomicAdd",
    "Arrive",
    "INSTRUCTIONS",
    "Instruction",
    "Sync",
    "WaitPriorGrid",
    "Assign",
    "Extract",
    "Cast",
    "Permute",
    "RegisterInit",
    "ThreadIndex",
    "View",
    "Dot",
    "DotShared",
    "DotWait",
    "DOT_TYPES",
    "Elementwise",
    "OPS",
    "COMPARISONS",
    "AllocShared",
    "CommitGroup",
    "CopyAsync",
    "PrefetchL2",
    "FreeShared",
    "GlobalView",
    "LoadGlobal",
    "LoadShared",
    "StoreGlobal",
    "StoreShared",
    "WaitGroup",
    "Reduce",
    "REDUCE_OPS",
    "AllocBarriers",
    "MbarrierArrive",
    "MbarrierExpectTx",
    "MbarrierWait",
    "CopyTma",
    "CopyBulk",
    "StoreTma",
    "StoreTmaWait",
]
