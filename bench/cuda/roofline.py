"""roofline.py: the two ceilings of this GPU, measured with PyTorch in the same run as the
hearth benchmark: device-to-device copy bandwidth (bytes read + written) and the bf16
GEMM rate (cuBLAS through torch.matmul, 8192^3, random data). Median of 20 timed runs
after warm-up, CUDA events. Prints one JSON line."""
import json
import statistics

import torch


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


n = 1 << 30  # 4 GiB of float32: far beyond the 60 MB L2
src = torch.randn(n // 4 * 4 // 4, device="cuda")
dst = torch.empty_like(src)
t = timed(lambda: dst.copy_(src))
copy_gbs = 2 * src.numel() * 4 / t / 1e9
m = 8192
x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
t = timed(lambda: x @ y)
print(json.dumps({"copy_gbs": copy_gbs, "bf16_gemm_tflops": 2 * m ** 3 / t / 1e12,
                  "gpu": torch.cuda.get_device_name(0)}))
