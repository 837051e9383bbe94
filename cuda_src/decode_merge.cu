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
#include "common/softmax_state.cuh"

// At most 4 warps per block: a small block keeps the tail of the grid short.
#define KVM_WARPS 4
// Columns per lane per pass: 8 x 32 lanes = 256 columns, every head_dim up to 256 in one
// pass over the splits (512 in two).
#define KVM_VEC 8
#define KVM_COLS (KVM_VEC * KV_WARP)
// Splits whose partial accumulators one lane loads before using any of them (4 x 8 floats).
#define KVM_SB 4

// Grid (rows), block 32 * W threads (W = min(KVM_WARPS, num_splits) warps), dynamic shared
// memory 4 * (W * head_dim + num_splits) bytes. One CTA per row: warp 0 finds M, the weights
// w_s and L; warp w then sums the splits s = w, w + W, ... (in increasing s, KVM_SB of them
// loaded before their FMAs), and the W partial sums are added in warp order. Rows are few
// exactly when splits are many (B = 1), so the splits, not the rows, carry the parallelism.
extern "C" __global__ __launch_bounds__(KVM_WARPS * KV_WARP) void kv_decode_merge_splits(
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
    extern __shared__ float kvm_smem[];
    __shared__ float big_m_s;
    __shared__ float total_s;
    float* w_s = kvm_smem;                     // [num_splits] weights exp(m_s - M)
    float* part_s = kvm_smem + num_splits;     // [W][head_dim] per-warp sums
    const int lane = threadIdx.x & (KV_WARP - 1);
    const int warp = threadIdx.x / KV_WARP;
    const int nw = blockDim.x / KV_WARP;
    const long long row = blockIdx.x;
    if (row >= rows) return;  // whole CTAs leave
    const float* m_row = m_part + row * split_stride;
    const float* l_row = l_part + row * split_stride;
    const float* acc_row = acc_part + row * split_stride * head_dim;
    float* o_row = o + row * head_dim;

    if (warp == 0) {
        float big_m = kv_neg_inf();
        for (int s = lane; s < num_splits; s += KV_WARP) big_m = fmaxf(big_m, m_row[s]);
        big_m = kv_warp_max(big_m);
        const float sink = sinks != nullptr ? sinks[row % num_heads] : kv_neg_inf();
        big_m = fmaxf(big_m, sink);
        float total = 0.f;
        if (big_m != kv_neg_inf()) {
            for (int s = lane; s < num_splits; s += KV_WARP) {
                const float w = kv_merge_weight(m_row[s], big_m);
                w_s[s] = w;
                total += l_row[s] * w;
            }
            total = kv_warp_sum(total);
            total += kv_merge_weight(sink, big_m);
        }
        if (lane == 0) {
            big_m_s = big_m;
            total_s = total;
        }
    }
    __syncthreads();
    const float big_m = big_m_s;
    if (big_m == kv_neg_inf()) {  // uniform over the CTA
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) o_row[d] = 0.f;
        if (threadIdx.x == 0) lse[row] = kv_neg_inf();
        return;
    }
    const float total = total_s;

    for (int d0 = 0; d0 < head_dim; d0 += KVM_COLS) {
        float acc[KVM_VEC];
#pragma unroll
        for (int k = 0; k < KVM_VEC; ++k) acc[k] = 0.f;
        for (int s0 = warp; s0 < num_splits; s0 += KVM_SB * nw) {  // uniform per warp
            float a[KVM_SB][KVM_VEC];
            float w[KVM_SB];
#pragma unroll
            for (int u = 0; u < KVM_SB; ++u) {
                const int s = s0 + u * nw;
                w[u] = s < num_splits ? w_s[s] : 0.f;
                // An empty split (weight 0) has an acc that is never read.
                const bool live = w[u] != 0.f;
                const float* a_s = acc_row + (long long)s * head_dim;
#pragma unroll
                for (int v = 0; v < KVM_VEC; ++v) {
                    const int d = d0 + v * KV_WARP + lane;
                    a[u][v] = (live && d < head_dim) ? a_s[d] : 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < KVM_SB; ++u) {
                if (w[u] != 0.f) {
#pragma unroll
                    for (int v = 0; v < KVM_VEC; ++v) acc[v] = fmaf(a[u][v], w[u], acc[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < KVM_VEC; ++v) {
            const int d = d0 + v * KV_WARP + lane;
            if (d < head_dim) part_s[warp * head_dim + d] = acc[v];
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.f;
        for (int k = 0; k < nw; ++k) sum += part_s[k * head_dim + d];
        o_row[d] = sum / total;
    }
    if (threadIdx.x == 0) lse[row] = big_m + logf(total);
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
