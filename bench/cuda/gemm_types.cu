// gemm_types.cu: the prefill GEMM of hearth's cuBLAS path (cuda_gemm.cu gemm_run: y[T][n] =
// x[T][k] . W^T, W row-major [n][k], f32 output, CUBLAS_COMPUTE_32F) with f16 and with bf16
// operands, at the Llama-3.1-8B shapes, so a gap between the two is measured on cuBLAS alone.
// For each shape and type: cublasGemmEx with CUBLAS_GEMM_DEFAULT (what hearth calls), then
// every algorithm cublasLt's heuristic offers for the same problem (up to 8), timed with CUDA
// events (median of 9 after 3 warm-ups), in TFLOP/s. Build and run on the GPU machine:
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/cuda/gemm_types.cu -lcublas -lcublasLt -o gemm_types
//   ./gemm_types [T]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector>

#define CK(x)                                                                                                           \
    do {                                                                                                                \
        cudaError_t e_ = (x);                                                                                           \
        if (e_ != cudaSuccess) {                                                                                        \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                  \
            exit(1);                                                                                                    \
        }                                                                                                               \
    } while (0)
#define CB(x)                                                                                                           \
    do {                                                                                                                \
        int s_ = (int)(x);                                                                                              \
        if (s_ != 0) {                                                                                                  \
            fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, s_);                                        \
            exit(1);                                                                                                    \
        }                                                                                                               \
    } while (0)

__global__ void fill(unsigned short *p, size_t n, unsigned seed, int f16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned h = (unsigned)(i * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    float v = ((h >> 8) & 0xffff) / 65536.0f - 0.5f;
    if (f16) p[i] = __half_as_ushort(__float2half(v * 0.1f));
    else p[i] = __bfloat16_as_ushort(__float2bfloat16(v * 0.1f));
}

template <class F> static float time_ms(F f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) f();
    std::vector<float> t;
    for (int i = 0; i < 9; i++) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[4];
}

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 4096;
    const int shapes[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {28672, 4096}};
    size_t maxw = 28672ull * 4096, maxx = (size_t)T * 14336;
    unsigned short *W, *X;
    float *Y;
    void *ws;
    size_t wsb = 64ull << 20;
    CK(cudaMalloc(&W, maxw * 2));
    CK(cudaMalloc(&X, maxx * 2));
    CK(cudaMalloc(&Y, (size_t)T * 28672 * 4));
    CK(cudaMalloc(&ws, wsb));
    cublasHandle_t h;
    cublasLtHandle_t lt;
    CB(cublasCreate(&h));
    CB(cublasLtCreate(&lt));
    CB(cublasSetWorkspace(h, ws, wsb));
    printf("T = %d; TFLOP/s (2 n k T / time), median of 9\n", T);
    printf("%-12s %-5s %9s %s\n", "n x k", "type", "GemmEx", "cublasLt heuristic algorithms 0..");
    for (auto &s : shapes) {
        int n = s[0], k = s[1];
        double fl = 2.0 * n * k * T;
        for (int f16 = 1; f16 >= 0; f16--) {
            fill<<<(unsigned)((maxw + 255) / 256), 256>>>(W, (size_t)n * k, 7, f16);
            fill<<<(unsigned)((maxx + 255) / 256), 256>>>(X, (size_t)T * k, 11, f16);
            CK(cudaDeviceSynchronize());
            cudaDataType_t ty = f16 ? CUDA_R_16F : CUDA_R_16BF;
            const float one = 1.0f, zero = 0.0f;
            float ms = time_ms([&] {
                CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, T, k, &one, W, ty, k, X, ty, k, &zero, Y, CUDA_R_32F, n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            });
            printf("%5dx%-6d %-5s %9.1f", n, k, f16 ? "f16" : "bf16", fl / ms / 1e9);
            cublasLtMatmulDesc_t d;
            CB(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            CB(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            cublasLtMatrixLayout_t la, lb, lc;
            CB(cublasLtMatrixLayoutCreate(&la, ty, k, n, k));
            CB(cublasLtMatrixLayoutCreate(&lb, ty, k, T, k));
            CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, T, n));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            cublasLtMatmulHeuristicResult_t res[8];
            int got = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, 8, res, &got));
            for (int i = 0; i < got; i++) {
                float m = time_ms([&] {
                    CB(cublasLtMatmul(lt, d, &one, W, la, X, lb, &zero, Y, lc, Y, lc, &res[i].algo, ws, wsb, 0));
                });
                printf(" %7.1f", fl / m / 1e9);
            }
            printf("\n");
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(d);
        }
    }
    return 0;
}
