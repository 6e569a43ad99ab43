//#include "matmul_gemv_tree.wgsl"
// matmul_gemv_reduce.wgsl's form with subgroup operations (lowering.wgsl.SUBGROUP_FORMS; the
// device's subgroups are full, contiguous and of one power-of-two size n, as
// runtime.device.subgroup_reductions_usable checks). Where a column's LANES lanes are
// neighbouring invocations ('BT': stride 1) and LANES <= n, so that they lie in one subgroup, a
// butterfly of log2(LANES) subgroupShuffleXor steps adds them in registers, with no workgroup
// memory and no barrier; otherwise the tree (matmul_gemv_tree.wgsl). n is the same in every
// subgroup, so the branch is uniform at run time; naga accepts the barriers behind it, but
// WGSL's static uniformity analysis (e.g. Tint's) would not, as it takes subgroupAdd's result as
// non-uniform. Uniform control flow only.
// Measured at one row only (lowering.wgsl.SUBGROUP_FORMS): there the butterfly beat the tree at
// the column counts gemv_bt_cols takes (8 for 1x576x3072, 16 for the LM head), but was slower
// alone at 16 columns for 1x576x576 and 1x576x960 and at 8 for 1x1536x576
// (bench/results/gemv_prologue_h200/cols.json); GEMVs of 2 to 4 rows take it unmeasured.

fn lanes_sum(li: u32, lane: u32, stride: u32, v: vec4<f32>) -> vec4<f32> {
    if (stride == 1u && LANES <= subgroupAdd(1u)) {
        var t = v;
        for (var s = LANES / 2u; s > 0u; s = s / 2u) {
            t = t + subgroupShuffleXor(t, s);
        }
        return t;  // the column's sum, in each of its lanes
    }
    return lanes_tree(li, lane, stride, v);
}
