"""The example programs with the constants the codegen and GPU tests build them with."""

from __future__ import annotations

import lowvm
from lowvm.kernels.cast import cast_roundtrip, pack_lowbit, unpack_lowbit
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_gemm import GemmSchedule, finish_split, quant_gemm
from lowvm.kernels.quant_matmul import quant_matmul
from lowvm.kernels.repack import repack_program, unpack_program
from lowvm.kernels.vector_add import vector_add

EXAMPLES = {
    "vector_add": (vector_add, {}),
    "pack_int3": (pack_lowbit, {"wtype": lowvm.int3}),
    "pack_e3m2": (pack_lowbit, {"wtype": lowvm.float6_e3m2}),
    "unpack_uint5": (unpack_lowbit, {"wtype": lowvm.uint5}),
    "unpack_e4m3": (unpack_lowbit, {"wtype": lowvm.float8_e4m3}),
    "cast_e2m1": (cast_roundtrip, {"wtype": lowvm.float4_e2m1}),
    "matmul_f16": (matmul_f16, {}),
    "quant_matmul_int4": (quant_matmul, {"wtype": lowvm.int4, "group": 64}),
    "quant_matmul_int3": (quant_matmul, {"wtype": lowvm.int3, "group": 128}),
    "quant_matmul_e3m2": (quant_matmul, {"wtype": lowvm.float6_e3m2, "group": 64}),
    # the library's decode GEMM: register prefetch, and weights staged in shared memory
    "quant_gemm_int4_decode": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        prefetch=4)}),
    "quant_gemm_uint4_zeros_staged": (quant_gemm, {
        "wtype": lowvm.uint4, "zero_point": True,
        "schedule": GemmSchedule(stages=4, weights_shared=True)}),
    "quant_gemm_int3_staged": (quant_gemm, {"wtype": lowvm.int3, "schedule": GemmSchedule(
        split=2, stages=6, weights_shared=True)}),
    "quant_gemm_int4_m64_unfused": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        bm=64, warps_m=2, split=4, stages=3, fused_split=False)}),
    # choose_schedule's split-8 pick for 8..23 K steps per block, at the widest type
    "quant_gemm_int8_split8_p2": (quant_gemm, {"wtype": lowvm.int8, "schedule": GemmSchedule(
        split=8, stages=2, prefetch=2)}),
    # the occupancy hint (vm.set_min_blocks): 6 blocks per SM, still unspilled for int4
    "quant_gemm_int4_min_blocks6": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        split=8, stages=4, min_blocks=6)}),
    # one M-warp over 64 rows, the K step's MMAs over 16-deep slices (vm.extract)
    "quant_gemm_int4_m64_one_warp": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        bm=64, warps_m=1, split=4, stages=3, k_slice=16, fused_split=False)}),
    "quant_gemm_int8_m64_one_warp": (quant_gemm, {"wtype": lowvm.int8, "schedule": GemmSchedule(
        bm=64, warps_m=1, split=2, stages=2, k_slice=16, fused_split=False)}),
    # choose_schedule's pick for 16 < M <= 64 where K < 14336: 32-deep slices
    "quant_gemm_int3_m64_one_warp_k32": (quant_gemm, {"wtype": lowvm.int3, "schedule": GemmSchedule(
        bm=64, warps_m=1, split=2, stages=3, k_slice=32, fused_split=False)}),
    # weights asked into the L2 two steps beyond the registers (vm.prefetch_l2)
    "quant_gemm_int4_l2_ahead": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        split=8, stages=4, l2_ahead=2)}),
    # x held for the block's whole K range: one row read as all 16 (M = 1), 16 rows in
    # swizzled slabs (M <= 16 on split shapes), int8 the widest weights
    "quant_gemm_int4_x_whole_one_row": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        prefetch=2, x_whole=4096, x_rows=1)}),
    "quant_gemm_uint4_zeros_x_whole": (quant_gemm, {
        "wtype": lowvm.uint4, "zero_point": True,
        "schedule": GemmSchedule(split=8, prefetch=2, x_whole=512)}),
    "quant_gemm_int8_x_whole_one_row": (quant_gemm, {"wtype": lowvm.int8, "schedule": GemmSchedule(
        split=8, prefetch=2, x_whole=1792, x_rows=1)}),
    # x held whole, weights asked into the L2 four steps beyond the registers (one bulk
    # prefetch per tile on sm_90)
    "quant_gemm_int4_x_whole_l2_ahead": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        prefetch=2, x_whole=4096, x_rows=1, l2_ahead=4)}),
    # int3 held whole in its split_pairs order (spliced words, gathered bytes)
    "quant_gemm_int3_x_whole_one_row": (quant_gemm, {"wtype": lowvm.int3, "schedule": GemmSchedule(
        prefetch=4, x_whole=4096, x_rows=1)}),
    # batch 1 with the weights as the MMA's A operand (swap_ab, the library's M = 1
    # choice): int4 unsplit, uint4 with zero points at split 8, int3
    "quant_gemm_int4_swap_ab": (quant_gemm, {"wtype": lowvm.int4, "schedule": GemmSchedule(
        prefetch=4, x_whole=4096, x_rows=1, swap_ab=True)}),
    "quant_gemm_uint4_zeros_swap_ab_split8": (quant_gemm, {
        "wtype": lowvm.uint4, "zero_point": True, "schedule": GemmSchedule(
            split=8, prefetch=1, x_whole=512, x_rows=1, swap_ab=True)}),
    "quant_gemm_int3_swap_ab": (quant_gemm, {"wtype": lowvm.int3, "schedule": GemmSchedule(
        prefetch=4, x_whole=4096, x_rows=1, swap_ab=True)}),
    "finish_split": (finish_split, {}),
    "repack_int4": (repack_program, {"wtype": lowvm.int4}),
    "repack_e3m2_bk32": (repack_program, {"wtype": lowvm.float6_e3m2, "bk": 32}),
    "unpack_int3": (unpack_program, {"wtype": lowvm.int3}),
}
