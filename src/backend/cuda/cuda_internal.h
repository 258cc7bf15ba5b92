/* cuda_internal.h: helpers shared by the .cu files of the CUDA backend (turning CUDA
 * error codes into hearth_error values). Not part of the backend's API; C++ only. */
#ifndef HEARTH_BACKEND_CUDA_INTERNAL_H
#define HEARTH_BACKEND_CUDA_INTERNAL_H
/* hearth's C headers carry no extern "C" of their own. */
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "base/err.h"
}
#include <cuda_runtime.h>

/* The backend's one stream (cuda_device.cu): every kernel, cuBLAS call and step copy goes
 * there so a decode step can be captured into a CUDA graph (the legacy default stream
 * cannot be captured). It is a blocking stream: plain cudaMemcpy calls still order with it. */
cudaStream_t cuda_stream(void);

/* cuda_gemv_v2.cu, for cuda_gemv.cu's int8 path: launches the v2 GEMV of ws[0..nw) (nw <= 3
 * weights of one format and k on the same T = 1, 2, 3, 4 or 8 rows of quantized
 * activations, ys[i] = x · ws[i]^T, all in one launch) and returns 1, or returns 0 (nothing
 * launched) when v2 does not take them together. _groups: whether a and b can share a
 * launch. _force_pdl: cuda_gemv_force_pdl for that file's launches. */
int cuda_gemv_v2_launch(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float2 *xs,
                        int T);
int cuda_gemv_v2_groups(const cuda_weight *a, const cuda_weight *b);
/* One weight at T rows where batch invariance is not asked for: as cuda_gemv_v2_launch, and
 * also every Q6_K weight from 2 rows on (gemv_q6_k_i8's cost grows with the rows). */
int cuda_gemv_v2_launch_rows(const cuda_weight *w, float *y, const int8_t *xq, const float2 *xs, int T);
void cuda_gemv_v2_force_pdl(int mode);
/* cuda_gemv_mlx4.cu, the same for MLX 4-bit weights that cuda_mlx4_int8_takes (one group size
 * and scale type per launch). */
int cuda_gemv_mlx4_launch(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float2 *xs,
                          int T);
int cuda_gemv_mlx4_groups(const cuda_weight *a, const cuda_weight *b);
void cuda_gemv_mlx4_force_pdl(int mode);
/* cuda_gemv_affine.cu: the GEMV of a DT_AFFINE weight on T <= 8 rows (T = 1, 2, 3, 4, 8)
 * of int8 activations xq / xs, or, with xq NULL, of float activations x; and its bf16
 * dequantization into out (n * k elements). */
void cuda_gemv_affine_launch(const cuda_weight *w, const int8_t *xq, const float2 *xs, const float *x, float *y,
                             int T);
void cuda_dequant_affine_launch(const cuda_weight *w, void *out);

/* cuda_gemv_experts' launches (one per file, returning 0 when that file's kernels do not
 * take the format): tabs[0..nw) of one format and k, P pairs of expert ids sel, activation
 * row p / xdiv of xq / xs. The affine one takes nw = 1. */
int cuda_gemv_v2_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P, int xdiv,
                         const int8_t *xq, const float2 *xs);
int cuda_gemv_mlx4_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P, int xdiv,
                           const int8_t *xq, const float2 *xs);
int cuda_gemv_affine_experts(const cuda_expert_table *tab, float *y, const int32_t *sel, int P, int xdiv,
                             const int8_t *xq, const float2 *xs);

/* cuda_mmq.cu, for cuda_gemv.cu's int8 path: launches the batched tensor-core matmul of w
 * on T rows of quantized activations (one launch for all T) and returns 1, or returns 0
 * (nothing launched) when it does not take w at T (cuda_mmq_takes, alignment, shared memory
 * of this device, or not yet prepared while a graph is being captured). _prepare: sets the
 * kernels' shared-memory opt-in (outside a capture; cuda_gemv_reserve calls it). */
int cuda_mmq_launch(const cuda_weight *w, const int8_t *xq, const float2 *xs, float *y, int T);
void cuda_mmq_prepare(void);

/* Fills err from a CUDA status; `what` says which call or kernel failed. */
static inline hearth_status cuda_status(cudaError_t e, const char *what, hearth_error *err) {
    if (e == cudaSuccess) return HEARTH_OK;
    hearth_status s = e == cudaErrorMemoryAllocation ? HEARTH_ERR_NOMEM : HEARTH_ERR_IO;
    return err_set(err, s, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
/* After a launch: reports a bad launch configuration at once (faults inside the kernel
 * surface at the next cuda_sync). */
static inline hearth_status cuda_launched(const char *kernel, hearth_error *err) {
    return cuda_status(cudaGetLastError(), kernel, err);
}
#endif
