// paged.cuh: page / split ranges of a paged sequence, mirroring kvkit/splits.py exactly.
//
// n_pages = ceil(seq_len / block_size); pages_per_split = ceil(n_pages / num_splits);
// split s covers pages [s * pps, min((s + 1) * pps, n_pages)), empty when first >= end.
// Index contents are never trusted (cuda_src/README.md): a seq_len outside
// [q_len, max_blocks * block_size] or a block-table entry outside [0, num_blocks) is
// reported through error_flag (bits 4 and 2) and treated as empty / skipped.
#pragma once

#define KV_ERR_SLOT 1
#define KV_ERR_BLOCK_TABLE 2
#define KV_ERR_SEQ_LEN 4

// kvkit.splits.page_range. seq_len >= 0, block_size >= 1, num_splits >= 1.
__device__ __forceinline__ void kv_page_range(int seq_len, int block_size, int num_splits,
                                              int split, int* first, int* end) {
    const int n_pages = (int)(((long long)seq_len + block_size - 1) / block_size);
    const int pps = (n_pages + num_splits - 1) / num_splits;
    const long long f = (long long)split * pps;
    const long long e = f + pps < n_pages ? f + pps : n_pages;
    *first = f < n_pages ? (int)f : n_pages;
    *end = (int)e;
}

// A sequence length the block table can hold and that covers the q_len query tokens.
__device__ __forceinline__ bool kv_seq_len_ok(int seq_len, int q_len, int max_blocks,
                                              int block_size) {
    return seq_len >= q_len && (long long)seq_len <= (long long)max_blocks * block_size;
}

// A block-table entry that names a page of the cache (num_blocks >= 0): one unsigned
// compare, negative entries wrap above num_blocks.
__device__ __forceinline__ bool kv_page_ok(int page, int num_blocks) {
    return (unsigned)page < (unsigned)num_blocks;
}

// Write kernels: the (token, head) of a row (row = token * H + head) and the (page, offset)
// of a slot (slot = page * block_size + offset). narrow: every operand below 2^32 (the
// caller's uniform test), so 32-bit unsigned divisions do (a 64-bit division by a run-time
// divisor costs several times as many instructions); exact either way.
__device__ __forceinline__ void kv_row_token_head(long long row, int n_heads, bool narrow,
                                                  long long* token, int* head) {
    if (narrow) {
        const unsigned r = (unsigned)row;
        const unsigned t = r / (unsigned)n_heads;
        *token = (long long)t;
        *head = (int)(r - t * (unsigned)n_heads);
    } else {
        const long long t = row / n_heads;
        *token = t;
        *head = (int)(row - t * n_heads);
    }
}
__device__ __forceinline__ void kv_slot_page(long long slot, int block_size, bool narrow,
                                             long long* page, long long* offset) {
    if (narrow) {
        const unsigned s = (unsigned)slot;
        const unsigned b = s / (unsigned)block_size;
        *page = (long long)b;
        *offset = (long long)(s - b * (unsigned)block_size);
    } else {
        const long long b = slot / block_size;
        *page = b;
        *offset = slot - b * block_size;
    }
}
// The narrow test for n_tokens x n_heads rows and a cache of capacity slots.
__device__ __forceinline__ bool kv_write_indices_narrow(long long n_tokens, int n_heads,
                                                        long long capacity) {
    return n_tokens * n_heads <= 0xFFFFFFFFll && capacity <= 0xFFFFFFFFll;
}

// floor(n / d) for every 32-bit n, d a launch-uniform divisor given by the host's magic numbers
// (kvkit/cuda/write.py udiv_magic: m, s1, s2; Granlund & Montgomery, "Division by invariant
// integers using multiplication", PLDI 1994, fig. 4.1): five instructions where a division by
// a run-time divisor takes about twenty.
struct KvUDiv {
    int d;         // the divisor (n_heads or block_size), for the wide path and remainders
    unsigned m;    // magic multiplier
    int s1, s2;    // shifts
};
__device__ __forceinline__ unsigned int kv_udiv_magic(unsigned int n, const KvUDiv& q) {
    const unsigned int t = __umulhi(q.m, n);
    return (t + ((n - t) >> q.s1)) >> q.s2;
}
// kv_row_token_head / kv_slot_page with the narrow path's division by magic numbers.
__device__ __forceinline__ void kv_row_token_head(long long row, const KvUDiv& heads, bool narrow,
                                                  long long* token, int* head) {
    if (narrow) {
        const unsigned r = (unsigned)row, t = kv_udiv_magic(r, heads);
        *token = (long long)t;
        *head = (int)(r - t * (unsigned)heads.d);
    } else {
        kv_row_token_head(row, heads.d, false, token, head);
    }
}
__device__ __forceinline__ void kv_slot_page(long long slot, const KvUDiv& bs, bool narrow,
                                             long long* page, long long* offset) {
    if (narrow) {
        const unsigned s = (unsigned)slot, b = kv_udiv_magic(s, bs);
        *page = (long long)b;
        *offset = (long long)(s - b * (unsigned)bs.d);
    } else {
        kv_slot_page(slot, bs.d, false, page, offset);
    }
}
