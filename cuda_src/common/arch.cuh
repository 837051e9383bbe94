// arch.cuh: the ONLY file in cuda_src that tests __CUDA_ARCH__ (cuda_src/README.md).
//
// Feature macros every other file branches on:
//   KVKIT_ARCH     the __CUDA_ARCH__ number of the device pass (800, 890, 900, 1000, 1200...);
//                  0 on the host pass.
//   KVKIT_HW_FP8   1 when cvt.rn.satfinite.e4m3x2.f32 exists (sm_89 and newer), else 0.
//   KVKIT_HW_FP4   1 when cvt.rn.satfinite.e2m1x2.f32 exists: only the arch-specific
//                  Blackwell targets sm_100a / sm_120a. __CUDA_ARCH_SPECIFIC__ alone is not
//                  enough (it is also defined for sm_90a, which lacks these conversions), so
//                  the family feature macro NVRTC defines for sm_100a / sm_120a is required
//                  together with the matching arch number.
//   KVKIT_HW_F16   1 when the fp16 conversions use cvt.rn.f16.f32 / cvt.f32.f16 (every
//                  target), 0 for the integer twins.
//   KVKIT_BULK_COPY 1 when cp.async.bulk (the copy engine, completing on an mbarrier) and
//                  mbarrier expect_tx exist: sm_90 and newer.
//   KVKIT_GRID_DEP 1 when griddepcontrol (programmatic dependent launch) exists: sm_90 and
//                  newer.
//
// -DKVKIT_FORCE_SOFTWARE_CONVERSIONS=1 turns every hardware conversion path off (both macros
// 0), so the software twins can be run and compared on any GPU.
#pragma once

#if defined(__CUDA_ARCH__)
#define KVKIT_ARCH __CUDA_ARCH__
#else
#define KVKIT_ARCH 0
#endif

#if defined(KVKIT_FORCE_SOFTWARE_CONVERSIONS) && KVKIT_FORCE_SOFTWARE_CONVERSIONS
#define KVKIT_HW_FP8 0
#define KVKIT_HW_FP4 0
#define KVKIT_HW_F16 0
#else
#define KVKIT_HW_F16 1
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KVKIT_HW_FP8 1
#else
#define KVKIT_HW_FP8 0
#endif
#if defined(__CUDA_ARCH__) &&                                                 \
    ((defined(__CUDA_ARCH_FEAT_SM100_ALL) && __CUDA_ARCH__ == 1000) ||        \
     (defined(__CUDA_ARCH_FEAT_SM120_ALL) && __CUDA_ARCH__ == 1200))
#define KVKIT_HW_FP4 1
#else
#define KVKIT_HW_FP4 0
#endif
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVKIT_BULK_COPY 1
#else
#define KVKIT_BULK_COPY 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVKIT_GRID_DEP 1
#else
#define KVKIT_GRID_DEP 0
#endif

// Programmatic dependent launch (sm_90+; no-ops elsewhere). A kernel launched with the
// programmatic-serialization attribute may start before the kernel ahead of it in the stream
// has finished: kv_grid_dep_wait() blocks until that kernel has completed and its memory is
// visible (it returns at once for a kernel launched the ordinary way). kv_grid_dep_trigger()
// lets such a dependent launch begin once every CTA of this grid has called it or exited.
__device__ __forceinline__ void kv_grid_dep_wait() {
#if KVKIT_GRID_DEP
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void kv_grid_dep_trigger() {
#if KVKIT_GRID_DEP
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
