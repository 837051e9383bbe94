// decode_merge.cu: split-K decode stage 2, and the public merge_states on the GPU.
//
// kv_decode_merge_splits merges the partial states (m, l, acc) that stage 1 wrote for each
// split (and an optional per-head sink logit) into o and lse, exactly the rule of
// kvkit.cpu.decode.merge_splits:
//   M = max(max_s m_s, sink_h);  w_s = exp(m_s - M) (0 for an empty split, m_s = -inf);
//   L = sum_s l_s w_s + exp(sink_h - M);  o = (sum_s w_s acc_s) / L;  lse = M + log(L).
//   A row with nothing visible and no sink: o = 0, lse = -inf (no 0/0, no NaN).
// kv_merge_states combines S normalized partial results (o_s, lse_s) of disjoint key sets,
// the rule of kvkit.cpu.merge.merge_states:
//   M = max_s lse_s; w_s = exp(lse_s - M); parts with w_s = 0 are ignored (even a NaN o_s);
//   o = (sum_s w_s o_s) / sum_s w_s; lse = M + log(sum_s w_s); all parts empty: o = 0,
//   lse = -inf.
// kv_merge_states: one warp per row; kv_decode_merge_splits: one CTA per row (its splits
// spread over the warps). head_dim is a run-time argument (no format defines needed),
// handled in chunks of KVM_COLS columns held in registers.
#include "common/arch.cuh"
#include "common/softmax_state.cuh"

// 1 when kv_decode_merge_splits waits for stage 1 by griddepcontrol (sm_90+): the launcher
// then launches it with the programmatic-serialization attribute (kvkit/cuda/decode.py), so
// its CTAs are scheduled while stage 1 drains instead of after it. Never set the attribute
// for a build without the wait: the merge would read partial states still being written.
extern "C" __device__ const int kv_merge_grid_dep = KVKIT_GRID_DEP;

// kv_merge_states: warps per block (one row each); a small block keeps the tail of the grid
// short.
#define KVM_WARPS 4
// Columns per lane per pass of kv_merge_states: 8 x 32 lanes = 256 columns, every head_dim up
// to 256 in one pass over the parts (512 in two).
#define KVM_VEC 8
#define KVM_COLS (KVM_VEC * KV_WARP)

// kv_decode_merge_splits: each thread owns KVD_MCOLS adjacent columns of one split group.
#define KVD_MCOLS 4
// Splits a thread loads before any result is known (the loads of one pass are independent:
// one memory round trip per pass). With 32 split groups, MAX_SPLITS = 128 (kvkit/splits.py)
// is one pass.
#define KVD_MSPL 4
// Threads per block at most: 8 warps (the host picks the block shape, kvkit/cuda/decode.py
// merge_block).
#define KVD_MTHREADS 256

// Grid (rows, column chunks), block (CG, NSG): CG column groups of KVD_MCOLS columns (chunk
// y covers columns [y CG KVD_MCOLS, (y + 1) CG KVD_MCOLS)) times NSG split groups, CG * NSG
// <= KVD_MTHREADS, CG and NSG powers of two; no dynamic shared memory. Stage 1 leaves this
// merge on the critical path of every multi-split step, and at small batch its few rows
// carry the whole step's latency (measured on the H200: 3-6 us of a 12-74 us graph step at
// B = 1), so it is written for latency: every thread issues the m, l and acc loads of its
// splits (s = sg, sg + NSG, ...) at once, before M is known (an empty split's acc is loaded
// but never used: its weight is 0), then one block max for M, one block sum over the split
// groups (lane shuffles, then shared memory across warps) for the columns and L.
extern "C" __global__ __launch_bounds__(KVD_MTHREADS) void kv_decode_merge_splits(
    const float* __restrict__ m_part,    // (rows, split_stride): running max logit per split
    const float* __restrict__ l_part,    // (rows, split_stride): sum of exp(logit - m)
    const float* __restrict__ acc_part,  // (rows, split_stride, head_dim): sum exp(..) * v
    const float* __restrict__ sinks,     // (num_heads,) sink logits, or null
    long long rows,                      // B * q_len * num_heads; row % num_heads = head
    int num_heads, int head_dim,
    int num_splits,                      // splits stage 1 used, <= split_stride
    int split_stride,                    // the partial buffers' split axis
    float* __restrict__ o,               // (rows, head_dim)
    float* __restrict__ lse)             // (rows,) natural log
{
    // Per warp: its column groups' sums (up to 32 groups x KVD_MCOLS), then its total of l w.
    __shared__ float red_s[KVD_MTHREADS / KV_WARP][KVD_MCOLS * KV_WARP + 1];
    __shared__ float max_s[KVD_MTHREADS / KV_WARP];
    const int cg = threadIdx.x;
    const int sg = threadIdx.y;
    const int CG = blockDim.x;
    const int NSG = blockDim.y;
    const int tid = sg * CG + cg;
    const int lane = tid & (KV_WARP - 1);
    const int warp = tid / KV_WARP;
    const int nwarps = (CG * NSG + KV_WARP - 1) / KV_WARP;
    const long long row = blockIdx.x;
    const float* m_row = m_part + row * split_stride;
    const float* l_row = l_part + row * split_stride;
    const float* acc_row = acc_part + row * split_stride * head_dim;
    const int d0 = (blockIdx.y * CG + cg) * KVD_MCOLS;
    kv_grid_dep_wait();  // stage 1's partial states complete and visible

    float acc[KVD_MCOLS];
#pragma unroll
    for (int v = 0; v < KVD_MCOLS; ++v) acc[v] = 0.f;
    float total = 0.f;
    float big_m = sinks != nullptr ? sinks[row % num_heads] : kv_neg_inf();
    const float sink = big_m;
    // Passes of KVD_MSPL splits per thread (one pass for num_splits <= KVD_MSPL * NSG).
    for (int s0 = 0; s0 < num_splits; s0 += KVD_MSPL * NSG) {  // uniform over the block
        float ms[KVD_MSPL], ls[KVD_MSPL], a[KVD_MSPL][KVD_MCOLS];
#pragma unroll
        for (int u = 0; u < KVD_MSPL; ++u) {
            const int s = s0 + u * NSG + sg;
            const bool in = s < num_splits;
            ms[u] = in ? m_row[s] : kv_neg_inf();
            ls[u] = in ? l_row[s] : 0.f;
            const float* a_s = acc_row + (long long)s * head_dim;
#pragma unroll
            for (int v = 0; v < KVD_MCOLS; ++v)
                a[u][v] = (in && d0 + v < head_dim) ? a_s[d0 + v] : 0.f;
        }
        // M over every split of the row: each thread's, then the block's (all threads of a
        // pass hold all its splits between them).
        float pm = kv_neg_inf();
#pragma unroll
        for (int u = 0; u < KVD_MSPL; ++u) pm = fmaxf(pm, ms[u]);
        pm = kv_warp_max(pm);
        if (lane == 0) max_s[warp] = pm;
        __syncthreads();
        float new_m = big_m;
        for (int w = 0; w < nwarps; ++w) new_m = fmaxf(new_m, max_s[w]);
        __syncthreads();  // max_s is rewritten by the next pass
        if (new_m == kv_neg_inf()) continue;  // uniform: nothing visible yet
        // A later pass with a larger max rescales the sums so far (exactly 1 in one pass).
        const float r = kv_merge_weight(big_m, new_m);
        if (r != 1.f) {
            total *= r;
#pragma unroll
            for (int v = 0; v < KVD_MCOLS; ++v) acc[v] *= r;
        }
        big_m = new_m;
#pragma unroll
        for (int u = 0; u < KVD_MSPL; ++u) {
            const float w = kv_merge_weight(ms[u], big_m);
            if (w != 0.f) {  // an empty split's acc is never used, even NaN
                total = fmaf(ls[u], w, total);
#pragma unroll
                for (int v = 0; v < KVD_MCOLS; ++v) acc[v] = fmaf(a[u][v], w, acc[v]);
            }
        }
    }
    if (big_m == kv_neg_inf()) {  // uniform: a row with nothing visible and no sink
        if (sg == 0) {
#pragma unroll
            for (int v = 0; v < KVD_MCOLS; ++v)
                if (d0 + v < head_dim) o[row * head_dim + d0 + v] = 0.f;
        }
        if (tid == 0 && blockIdx.y == 0) lse[row] = kv_neg_inf();
        return;
    }
    // Sum over the split groups: lanes of one column group first (tid = sg * CG + cg, so
    // lanes CG, 2 CG, ... apart), then the warps through shared memory.
    for (int off = CG; off < KV_WARP; off <<= 1) {
        total += __shfl_xor_sync(KV_FULL_MASK, total, off);
#pragma unroll
        for (int v = 0; v < KVD_MCOLS; ++v) acc[v] += __shfl_xor_sync(KV_FULL_MASK, acc[v], off);
    }
    if (lane < CG) {
#pragma unroll
        for (int v = 0; v < KVD_MCOLS; ++v) red_s[warp][lane * KVD_MCOLS + v] = acc[v];
        if (lane == 0) red_s[warp][KVD_MCOLS * KV_WARP] = total;
    }
    __syncthreads();
    if (tid < CG) {
        // Warps hold column groups [0, CG) (CG <= 32: every warp holds all of them, in its
        // first CG lanes) or, for CG > 32, warp w holds groups 32 w.. of one split group.
        const int gpw = CG < KV_WARP ? CG : KV_WARP;   // column groups per warp
        const int wps = CG < KV_WARP ? 1 : CG / KV_WARP;  // warps per split group
        float sum[KVD_MCOLS];
        float tot = 0.f;
#pragma unroll
        for (int v = 0; v < KVD_MCOLS; ++v) sum[v] = 0.f;
        for (int w = tid / gpw; w < nwarps; w += wps) {
#pragma unroll
            for (int v = 0; v < KVD_MCOLS; ++v) sum[v] += red_s[w][(tid % gpw) * KVD_MCOLS + v];
            tot += red_s[w - tid / gpw][KVD_MCOLS * KV_WARP];
        }
        tot += kv_merge_weight(sink, big_m);
#pragma unroll
        for (int v = 0; v < KVD_MCOLS; ++v)
            if (d0 + v < head_dim) o[row * head_dim + d0 + v] = sum[v] / tot;
        if (tid == 0 && blockIdx.y == 0) lse[row] = big_m + logf(tot);
    }
}

// Grid (ceil(rows / KVM_WARPS)), block KVM_WARPS * 32, no shared memory.
extern "C" __global__ __launch_bounds__(KVM_WARPS * KV_WARP) void kv_merge_states(
    const float* __restrict__ o_parts,    // (num_parts, rows, head_dim), C-contiguous
    const float* __restrict__ lse_parts,  // (num_parts, rows)
    long long rows, int head_dim, int num_parts,
    float* __restrict__ o,                // (rows, head_dim)
    float* __restrict__ lse)              // (rows,)
{
    const int lane = threadIdx.x & (KV_WARP - 1);
    const long long row = (long long)blockIdx.x * KVM_WARPS + threadIdx.x / KV_WARP;
    if (row >= rows) return;
    float* o_row = o + row * head_dim;

    float big_m = kv_neg_inf();
    for (int s = lane; s < num_parts; s += KV_WARP) big_m = fmaxf(big_m, lse_parts[s * rows + row]);
    big_m = kv_warp_max(big_m);
    if (big_m == kv_neg_inf()) {
        for (int d = lane; d < head_dim; d += KV_WARP) o_row[d] = 0.f;
        if (lane == 0) lse[row] = kv_neg_inf();
        return;
    }
    float total = 0.f;
    for (int s = lane; s < num_parts; s += KV_WARP)
        total += kv_merge_weight(lse_parts[s * rows + row], big_m);
    total = kv_warp_sum(total);

    for (int d0 = 0; d0 < head_dim; d0 += KVM_COLS) {
        float acc[KVM_VEC];
#pragma unroll
        for (int k = 0; k < KVM_VEC; ++k) acc[k] = 0.f;
        for (int s0 = 0; s0 < num_parts; s0 += KV_WARP) {
            const int s_mine = s0 + lane;
            const float w_mine =
                s_mine < num_parts ? kv_merge_weight(lse_parts[s_mine * rows + row], big_m)
                                   : 0.f;
            const int n = min(KV_WARP, num_parts - s0);
            for (int k = 0; k < n; ++k) {
                const float w = __shfl_sync(KV_FULL_MASK, w_mine, k);  // uniform loop
                if (!(w > 0.f)) continue;  // weight 0: the part's o is ignored, even NaN
                const float* a = o_parts + ((long long)(s0 + k) * rows + row) * head_dim;
#pragma unroll
                for (int v = 0; v < KVM_VEC; ++v) {
                    const int d = d0 + v * KV_WARP + lane;
                    if (d < head_dim) acc[v] = fmaf(a[d], w, acc[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < KVM_VEC; ++v) {
            const int d = d0 + v * KV_WARP + lane;
            if (d < head_dim) o_row[d] = acc[v] / total;
        }
    }
    if (lane == 0) lse[row] = big_m + logf(total);
}
