"""CUDA C kernels of the CUDA backend (NVRTC-compiled through CuPy, cached per process).

All kernels take NHWC float32 arrays and a flat 64-bit element count, and use grid-stride loops;
``act`` is 0 (none), 1 (ReLU) or 2 (ReLU6). The Winograd transforms are compiled once per
(α, n) so their tiles live in registers. Element-wise ops with broadcasting are CuPy
``ElementwiseKernel`` s. Nothing here allocates memory at run time, which CUDA graph capture needs.
"""

from __future__ import annotations

from functools import cache

import cupy as cp

THREADS = 256

COMMON = r"""
#define ACT(v, a) ((a) == 1 ? fmaxf((v), 0.f) : ((a) == 2 ? fminf(fmaxf((v), 0.f), 6.f) : (v)))
#define LOOP(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                        i += (long long)blockDim.x * gridDim.x)
"""

BASIC = COMMON + r"""
extern "C" __global__ void im2col(const float* __restrict__ x, float* __restrict__ col, long long total,
        int H, int W, int C, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW) {
    LOOP(idx, total) {
        int c = idx % C; long long r = idx / C;
        int j = r % kw; r /= kw; int i = r % kh; r /= kh;
        int ox = r % OW; r /= OW; int oy = r % OH; long long n = r / OH;
        int yy = oy * sh - pt + i * dh, xx = ox * sw - pl + j * dw;
        col[idx] = (yy >= 0 && yy < H && xx >= 0 && xx < W) ? x[((n * H + yy) * W + xx) * C + c] : 0.f;
    }
}

extern "C" __global__ void bias_act(float* y, const float* __restrict__ b, long long total, int C, int has_bias,
                                    int act) {
    LOOP(i, total) {
        float v = y[i];
        if (has_bias) v += b[i % C];
        y[i] = ACT(v, act);
    }
}

extern "C" __global__ void pool(const float* __restrict__ x, float* __restrict__ y, long long total, int H, int W,
        int C, int OH, int OW, int kh, int kw, int sh, int sw, int pt, int pl, int is_max, int act) {
    LOOP(idx, total) {
        int c = idx % C; long long r = idx / C; int ox = r % OW; r /= OW; int oy = r % OH; long long n = r / OH;
        float acc = is_max ? __int_as_float(0xff800000) : 0.f;
        int cnt = 0;
        for (int i = 0; i < kh; i++) {
            int yy = oy * sh - pt + i;
            if (yy < 0 || yy >= H) continue;
            for (int j = 0; j < kw; j++) {
                int xx = ox * sw - pl + j;
                if (xx < 0 || xx >= W) continue;
                float v = x[((n * H + yy) * W + xx) * C + c];
                acc = is_max ? fmaxf(acc, v) : acc + v;
                cnt++;
            }
        }
        if (!is_max) acc = cnt ? acc / cnt : 0.f;
        y[idx] = ACT(acc, act);
    }
}

extern "C" __global__ void depthwise(const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ b, float* __restrict__ y, long long total, int H, int W, int C, int OH, int OW,
        int OC, int mult, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int has_bias, int act) {
    LOOP(idx, total) {
        int co = idx % OC; long long r = idx / OC; int ox = r % OW; r /= OW; int oy = r % OH; long long n = r / OH;
        int ci = co / mult;
        float acc = has_bias ? b[co] : 0.f;
        for (int i = 0; i < kh; i++) {
            int yy = oy * sh - pt + i * dh;
            if (yy < 0 || yy >= H) continue;
            for (int j = 0; j < kw; j++) {
                int xx = ox * sw - pl + j * dw;
                if (xx < 0 || xx >= W) continue;
                acc += x[((n * H + yy) * W + xx) * C + ci] * w[(i * kw + j) * OC + co];
            }
        }
        y[idx] = ACT(acc, act);
    }
}

extern "C" __global__ void mean_hw(const float* __restrict__ x, float* __restrict__ y, long long total, int HW,
                                   int C) {
    LOOP(idx, total) {
        int c = idx % C; long long n = idx / C;
        float s = 0.f;
        for (int p = 0; p < HW; p++) s += x[(n * HW + p) * C + c];
        y[idx] = s / HW;
    }
}

extern "C" __global__ void softmax(const float* x, float* y, long long rows, int C, float beta) {
    LOOP(r, rows) {
        const float* xr = x + r * C; float* yr = y + r * C;
        float m = __int_as_float(0xff800000);
        for (int c = 0; c < C; c++) m = fmaxf(m, beta * xr[c]);
        float s = 0.f;
        for (int c = 0; c < C; c++) { float e = expf(beta * xr[c] - m); yr[c] = e; s += e; }
        for (int c = 0; c < C; c++) yr[c] /= s;
    }
}
"""

WINOGRAD = COMMON + r"""
extern "C" __global__ void wino_in(const float* __restrict__ x, const float* __restrict__ bt,
        float* __restrict__ v, long long total, int H, int W, int C, int th, int tw, int pt, int pl) {
    long long rows = total / C;
    LOOP(idx, total) {
        int c = idx % C; long long r = idx / C; int t = r % (th * tw); long long b = r / (th * tw);
        int y0 = (t / tw) * NOUT - pt, x0 = (t % tw) * NOUT - pl;
        float d[ALPHA][ALPHA];
        #pragma unroll
        for (int i = 0; i < ALPHA; i++) {
            int yy = y0 + i;
            #pragma unroll
            for (int j = 0; j < ALPHA; j++) {
                int xx = x0 + j;
                d[i][j] = (yy >= 0 && yy < H && xx >= 0 && xx < W) ? x[((b * H + yy) * W + xx) * C + c] : 0.f;
            }
        }
        float tmp[ALPHA][ALPHA];
        #pragma unroll
        for (int a = 0; a < ALPHA; a++) {
            #pragma unroll
            for (int j = 0; j < ALPHA; j++) {
                float s = 0.f;
                #pragma unroll
                for (int i = 0; i < ALPHA; i++) s += bt[a * ALPHA + i] * d[i][j];
                tmp[a][j] = s;
            }
        }
        #pragma unroll
        for (int a = 0; a < ALPHA; a++) {
            #pragma unroll
            for (int q = 0; q < ALPHA; q++) {
                float s = 0.f;
                #pragma unroll
                for (int j = 0; j < ALPHA; j++) s += tmp[a][j] * bt[q * ALPHA + j];
                v[((long long)(a * ALPHA + q) * rows + r) * C + c] = s;
            }
        }
    }
}

extern "C" __global__ void wino_out(const float* __restrict__ m, const float* __restrict__ at,
        const float* __restrict__ bias, float* __restrict__ y, long long total, int OH, int OW, int OC, int th,
        int tw, int has_bias, int act) {
    long long rows = total / OC;
    LOOP(idx, total) {
        int o = idx % OC; long long r = idx / OC; int t = r % (th * tw); long long b = r / (th * tw);
        float mm[ALPHA][ALPHA];
        #pragma unroll
        for (int a = 0; a < ALPHA; a++) {
            #pragma unroll
            for (int q = 0; q < ALPHA; q++) mm[a][q] = m[((long long)(a * ALPHA + q) * rows + r) * OC + o];
        }
        float tmp[NOUT][ALPHA];
        #pragma unroll
        for (int i = 0; i < NOUT; i++) {
            #pragma unroll
            for (int q = 0; q < ALPHA; q++) {
                float s = 0.f;
                #pragma unroll
                for (int a = 0; a < ALPHA; a++) s += at[i * ALPHA + a] * mm[a][q];
                tmp[i][q] = s;
            }
        }
        float bv = has_bias ? bias[o] : 0.f;
        int y0 = (t / tw) * NOUT, x0 = (t % tw) * NOUT;
        #pragma unroll
        for (int i = 0; i < NOUT; i++) {
            int yy = y0 + i;
            if (yy >= OH) continue;
            #pragma unroll
            for (int j = 0; j < NOUT; j++) {
                int xx = x0 + j;
                if (xx >= OW) continue;
                float s = bv;
                #pragma unroll
                for (int q = 0; q < ALPHA; q++) s += tmp[i][q] * at[j * ALPHA + q];
                y[((b * OH + yy) * OW + xx) * OC + o] = ACT(s, act);
            }
        }
    }
}
"""

_ACT = "v = act == 1 ? fmaxf(v, 0.f) : (act == 2 ? fminf(fmaxf(v, 0.f), 6.f) : v); "


@cache
def basic() -> cp.RawModule:
    return cp.RawModule(code=BASIC, options=("--std=c++14",))


@cache
def winograd(alpha: int, n: int) -> cp.RawModule:
    return cp.RawModule(code=WINOGRAD, options=("--std=c++14", f"-DALPHA={alpha}", f"-DNOUT={n}"))


@cache
def elementwise(name: str) -> cp.ElementwiseKernel:
    bodies = {
        "add": ("float32 x, float32 y, int32 act", "float v = x + y; "),
        "mul": ("float32 x, float32 y, int32 act", "float v = x * y; "),
        "act": ("float32 x, int32 act", "float v = x; "),
        "affine": ("float32 x, float32 s, float32 t, int32 act", "float v = x * s + t; "),
    }
    params, body = bodies[name]
    return cp.ElementwiseKernel(params, "float32 z", body + _ACT + "z = v;", f"leti_{name}")


def launch(kernel, total: int, args) -> None:
    """Launch ``kernel`` over ``total`` elements on the current stream (grid-stride, ≤ 65535·8 blocks)."""
    blocks = max(1, min((int(total) + THREADS - 1) // THREADS, 65535 * 8))
    kernel((blocks,), (THREADS,), args)
