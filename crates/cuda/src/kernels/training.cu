// The element-wise, reduction, convolution-lowering, pooling and optimizer kernels of
// lockstep-cuda, compiled once per process by NVRTC for the device's architecture.
//
// Every kernel walks its index range with a grid-stride loop, so any grid covers any size, and
// sums in a fixed order (no atomics): results are the same from run to run. Compiled with
// `--fmad=false`, so that `a * b + c` rounds as the CPU kernels round it.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)blockDim.x * gridDim.x)

#define NO_POSITION 0xFFFFFFFFFFFFFFFFull

// NVRTC has no <math.h>: -inf by its bits.
#define NEG_INFINITY __int_as_float(0xff800000)

extern "C" __global__ void fill_f32(float* out, float value, u64 n) {
    FOR_EACH(i, n) { out[i] = value; }
}

extern "C" __global__ void add_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = a[i] + b[i]; }
}

extern "C" __global__ void sub_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = a[i] - b[i]; }
}

extern "C" __global__ void mul_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = a[i] * b[i]; }
}

extern "C" __global__ void div_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = a[i] / b[i]; }
}

extern "C" __global__ void scale_f32(const float* x, float factor, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = x[i] * factor; }
}

extern "C" __global__ void scale_in_place_f32(float* x, float factor, u64 n) {
    FOR_EACH(i, n) { x[i] *= factor; }
}

// `max(x, 0)` with NaN giving 0, as `f32::max(NaN, 0.0)` does on the CPU.
extern "C" __global__ void relu_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

// `dy` where the relu's output `y` is positive, else 0.
extern "C" __global__ void relu_grad_f32(const float* dy, const float* y, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// `x + bias` along the last axis (`cols` values a row), then a relu when `relu` is non-zero.
extern "C" __global__ void bias_add_f32(const float* x, const float* bias, float* out, u64 cols,
                                        int relu, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i] + bias[i % cols];
        out[i] = relu && !(v > 0.0f) ? 0.0f : v;
    }
}

// The sums of each column over blocks of `block_rows` rows, rows in order within a block:
// `partials[b, j]` for block `b`. One thread per (block, column), so a bias gradient over a
// convolution's hundreds of thousands of rows is spread over the whole GPU; neighbouring
// threads read neighbouring columns.
extern "C" __global__ void column_block_sums_f32(const float* x, float* partials, u64 rows,
                                                 u64 cols, u64 block_rows) {
    u64 blocks = (rows + block_rows - 1) / block_rows;
    FOR_EACH(i, blocks * cols) {
        u64 b = i / cols, j = i % cols;
        u64 end = (b + 1) * block_rows < rows ? (b + 1) * block_rows : rows;
        float sum = 0.0f;
        for (u64 r = b * block_rows; r < end; ++r) {
            sum += x[r * cols + j];
        }
        partials[i] = sum;
    }
}

// The sum of each column of a `[rows, cols]` matrix, rows in order: the second pass over
// `column_block_sums_f32`'s partials. Unrolled so that many loads are in flight while the
// additions stay in order.
extern "C" __global__ void column_sums_f32(const float* x, float* out, u64 rows, u64 cols) {
    FOR_EACH(j, cols) {
        float sum = 0.0f;
#pragma unroll 16
        for (u64 r = 0; r < rows; ++r) {
            sum += x[r * cols + j];
        }
        out[j] = sum;
    }
}

// The sum of all `n` values by one block: each thread sums a strided share in order, then the
// shares are added pairwise in a fixed tree. Launched with one block of 256 threads.
extern "C" __global__ void sum_f32(const float* x, float* out, u64 n) {
    __shared__ float shares[256];
    float sum = 0.0f;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        sum += x[i];
    }
    shares[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            shares[threadIdx.x] += shares[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = shares[0];
    }
}

// A row's maximum and `Σ exp(x - max)`: what a softmax stable for huge logits divides by.
__device__ void softmax_terms(const float* row, u64 classes, float* top, float* total) {
    float m = NEG_INFINITY;
    for (u64 k = 0; k < classes; ++k) {
        m = fmaxf(m, row[k]);
    }
    float sum = 0.0f;
    for (u64 k = 0; k < classes; ++k) {
        sum += expf(row[k] - m);
    }
    *top = m;
    *total = sum;
}

// Per row of `[rows, classes]` logits: the cross-entropy against `labels[row]` (checked on
// the host to be below `classes`) and its gradient, `softmax - one_hot`, both stable for huge
// logits (the row's maximum is subtracted first).
extern "C" __global__ void sparse_softmax_cross_entropy_f32(const float* logits,
                                                            const unsigned int* labels,
                                                            float* loss, float* grad, u64 rows,
                                                            u64 classes) {
    FOR_EACH(r, rows) {
        const float* row = logits + r * classes;
        float top, total;
        softmax_terms(row, classes, &top, &total);
        unsigned int label = labels[r];
        loss[r] = logf(total) - (row[label] - top);
        for (u64 k = 0; k < classes; ++k) {
            float p = expf(row[k] - top) / total;
            grad[r * classes + k] = k == label ? p - 1.0f : p;
        }
    }
}

// Softmax along the last axis, stable for huge logits.
extern "C" __global__ void softmax_f32(const float* x, float* out, u64 rows, u64 classes) {
    FOR_EACH(r, rows) {
        const float* row = x + r * classes;
        float top, total;
        softmax_terms(row, classes, &top, &total);
        for (u64 k = 0; k < classes; ++k) {
            out[r * classes + k] = expf(row[k] - top) / total;
        }
    }
}

// The gradient through a softmax, from its output `y` and the output's gradient `g`, per row:
// `y · (g − Σ y·g)`.
extern "C" __global__ void softmax_grad_f32(const float* y, const float* g, float* out, u64 rows,
                                            u64 classes) {
    FOR_EACH(r, rows) {
        const float* yr = y + r * classes;
        const float* gr = g + r * classes;
        float dot = 0.0f;
        for (u64 k = 0; k < classes; ++k) {
            dot += yr[k] * gr[k];
        }
        for (u64 k = 0; k < classes; ++k) {
            out[r * classes + k] = yr[k] * (gr[k] - dot);
        }
    }
}

// Each row of `cols` values times its own scale: the gradient of a per-row loss, or a
// per-row value broadcast along its row (with `x` all ones).
extern "C" __global__ void scale_rows_f32(const float* x, const float* scales, float* out,
                                          u64 cols, u64 n) {
    FOR_EACH(i, n) { out[i] = x[i] * scales[i / cols]; }
}

// Natural logarithm.
extern "C" __global__ void log_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = logf(x[i]); }
}

extern "C" __global__ void exp_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = expf(x[i]); }
}

// The smooth functions of `Pointwise`, as lockstep-tensor's CPU kernels compute them, and their
// derivatives times `g`: from the input `x` (gelu, silu) or from the output `y` (tanh, sqrt,
// rsqrt).
#define SQRT_HALF 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f
#define SQRT_2_OVER_PI 0.79788456080286536f
#define GELU_CUBIC 0.044715f

extern "C" __global__ void tanh_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = tanhf(x[i]); }
}

extern "C" __global__ void tanh_grad_f32(const float* g, const float* y, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = g[i] * (1.0f - y[i] * y[i]); }
}

extern "C" __global__ void gelu_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + erff(v * SQRT_HALF));
    }
}

extern "C" __global__ void gelu_grad_f32(const float* g, const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * SQRT_HALF));
        float pdf = INV_SQRT_2PI * expf(-0.5f * v * v);
        out[i] = g[i] * (cdf + v * pdf);
    }
}

extern "C" __global__ void gelu_tanh_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        float t = tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v));
        out[i] = 0.5f * v * (1.0f + t);
    }
}

extern "C" __global__ void gelu_tanh_grad_f32(const float* g, const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        float t = tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v));
        float slope = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * v * v);
        out[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * slope);
    }
}

// The logistic function without overflow: each branch takes e^-|v| only.
__device__ float logistic(float v) {
    if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
    float e = expf(v);
    return e / (1.0f + e);
}

extern "C" __global__ void silu_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = x[i] * logistic(x[i]); }
}

extern "C" __global__ void silu_grad_f32(const float* g, const float* x, float* out, u64 n) {
    FOR_EACH(i, n) {
        float s = logistic(x[i]);
        out[i] = g[i] * (s * (1.0f + x[i] * (1.0f - s)));
    }
}

extern "C" __global__ void sqrt_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = sqrtf(x[i]); }
}

extern "C" __global__ void sqrt_grad_f32(const float* g, const float* y, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = g[i] * 0.5f / y[i]; }
}

extern "C" __global__ void rsqrt_f32(const float* x, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = 1.0f / sqrtf(x[i]); }
}

extern "C" __global__ void rsqrt_grad_f32(const float* g, const float* y, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = y[i];
        out[i] = g[i] * (-0.5f * v * v * v);
    }
}

// `a` where `condition` is non-zero, else `b`; all three of one length.
extern "C" __global__ void select_f32(const float* condition, const float* a, const float* b,
                                      float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = condition[i] != 0.0f ? a[i] : b[i]; }
}

// An array with its axes reordered: output value `i`, taken apart by the output's dimensions,
// reads the input at the sum of its indices times the input's stride of each axis.
#define PERMUTE_MAX_RANK 8
struct Permutation {
    u64 rank;
    u64 dims[PERMUTE_MAX_RANK];
    u64 strides[PERMUTE_MAX_RANK];
};

extern "C" __global__ void permute_f32(const float* x, float* out, Permutation p, u64 n) {
    FOR_EACH(i, n) {
        u64 rest = i, offset = 0;
        for (u64 d = p.rank; d-- > 0;) {
            offset += (rest % p.dims[d]) * p.strides[d];
            rest /= p.dims[d];
        }
        out[i] = x[offset];
    }
}

// Values limited to `[lo, hi]`, NaN kept, as `f32::clamp` does.
extern "C" __global__ void clip_f32(const float* x, float* out, float lo, float hi, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        out[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

// `g` where the clipped input `x` lay inside `[lo, hi]`, else 0.
extern "C" __global__ void clip_grad_f32(const float* g, const float* x, float* out, float lo,
                                         float hi, u64 n) {
    FOR_EACH(i, n) { out[i] = x[i] >= lo && x[i] <= hi ? g[i] : 0.0f; }
}

// The sizes of a convolution or pooling window over NHWC input, as the host's `Geometry`.
// The host checks that every size and every buffer length is below 2^31, so positions are
// taken apart with 32-bit division (a 64-bit division is a long software routine on a GPU,
// and these kernels do several per value), while sums that may go negative stay 64-bit.
struct Geometry {
    u32 batch, height, width, channels;
    u32 kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, out_h, out_w;
};

// Calls `visit(oy, ox, ky, kx)` for every window (output `oy`, `ox`) whose kernel offset
// (`ky`, `kx`) reads input position (`y`, `x`): the gathers that stand in for scattering
// (col2im, max pooling's gradient) without atomics. Windows come in the CPU's order, `oy` then
// `ox` ascending (the CPU scatters the windows in that order), so the sums have its bits: a
// larger kernel offset reads from an earlier window, hence the offsets count down.
template <typename Visit>
__device__ void for_each_window_over(const Geometry& g, u32 y, u32 x, Visit visit) {
    for (u32 ky = g.kernel_h; ky-- > 0;) {
        i64 sy = (i64)y + g.pad_top - ky;
        if (sy < 0 || (u32)sy % g.stride_h != 0) continue;
        u32 oy = (u32)sy / g.stride_h;
        if (oy >= g.out_h) continue;
        for (u32 kx = g.kernel_w; kx-- > 0;) {
            i64 sx = (i64)x + g.pad_left - kx;
            if (sx < 0 || (u32)sx % g.stride_w != 0) continue;
            u32 ox = (u32)sx / g.stride_w;
            if (ox >= g.out_w) continue;
            visit(oy, ox, ky, kx);
        }
    }
}

// Every kernel window unfolded into a row: `[batch·out_h·out_w, kernel_h·kernel_w·channels]`,
// zeros in the padding.
extern "C" __global__ void im2col_f32(const float* input, float* cols, Geometry g, u64 n) {
    FOR_EACH(i, n) {
        u32 t = (u32)i;
        u32 c = t % g.channels; t /= g.channels;
        u32 kx = t % g.kernel_w; t /= g.kernel_w;
        u32 ky = t % g.kernel_h; t /= g.kernel_h;
        u32 ox = t % g.out_w; t /= g.out_w;
        u32 oy = t % g.out_h;
        u32 b = t / g.out_h;
        i64 y = (i64)oy * g.stride_h + ky - g.pad_top;
        i64 x = (i64)ox * g.stride_w + kx - g.pad_left;
        bool inside = y >= 0 && y < (i64)g.height && x >= 0 && x < (i64)g.width;
        cols[i] = inside ? input[(((u64)b * g.height + y) * g.width + x) * g.channels + c] : 0.0f;
    }
}

// The adjoint of `im2col_f32`: each input value gathers the row values that read it, windows
// in order (no atomics).
extern "C" __global__ void col2im_f32(const float* cols, float* input, Geometry g, u64 n) {
    FOR_EACH(i, n) {
        u32 t = (u32)i;
        u32 c = t % g.channels; t /= g.channels;
        u32 x = t % g.width; t /= g.width;
        u32 y = t % g.height;
        u32 b = t / g.height;
        float sum = 0.0f;
        for_each_window_over(g, y, x, [&](u32 oy, u32 ox, u32 ky, u32 kx) {
            u64 row = ((u64)b * g.out_h + oy) * g.out_w + ox;
            sum += cols[((row * g.kernel_h + ky) * g.kernel_w + kx) * g.channels + c];
        });
        input[i] = sum;
    }
}

// Max pooling over NHWC input with the input index of each maximum, as the CPU kernel decides:
// `>` keeps the first maximum, a NaN is taken and kept, and a window that takes no value (all
// padding, or all -inf) gives -inf and NO_POSITION, which routes no gradient.
extern "C" __global__ void max_pool_f32(const float* input, float* out, u64* argmax, Geometry g,
                                        u64 n) {
    FOR_EACH(i, n) {
        u32 t = (u32)i;
        u32 c = t % g.channels; t /= g.channels;
        u32 ox = t % g.out_w; t /= g.out_w;
        u32 oy = t % g.out_h;
        u32 b = t / g.out_h;
        float best = NEG_INFINITY;
        u64 arg = NO_POSITION;
        for (u32 ky = 0; ky < g.kernel_h; ++ky) {
            i64 y = (i64)oy * g.stride_h + ky - g.pad_top;
            if (y < 0 || y >= (i64)g.height) continue;
            for (u32 kx = 0; kx < g.kernel_w; ++kx) {
                i64 x = (i64)ox * g.stride_w + kx - g.pad_left;
                if (x < 0 || x >= (i64)g.width) continue;
                u64 at = (((u64)b * g.height + y) * g.width + x) * g.channels + c;
                float v = input[at];
                if (v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    arg = at;
                }
            }
        }
        out[i] = best;
        argmax[i] = arg;
    }
}

// The gradient of `max_pool_f32`: each input value gathers the gradients of the windows whose
// maximum it was (no atomics).
extern "C" __global__ void max_pool_grad_f32(const float* dy, const u64* argmax, float* dx,
                                             Geometry g, u64 n) {
    FOR_EACH(i, n) {
        u32 t = (u32)i;
        u32 c = t % g.channels; t /= g.channels;
        u32 x = t % g.width; t /= g.width;
        u32 y = t % g.height;
        u32 b = t / g.height;
        float sum = 0.0f;
        for_each_window_over(g, y, x, [&](u32 oy, u32 ox, u32, u32) {
            u64 j = (((u64)b * g.out_h + oy) * g.out_w + ox) * g.channels + c;
            if (argmax[j] == i) sum += dy[j];
        });
        dx[i] = sum;
    }
}

// Inverted dropout with a counter-based mask: value `i` is kept when the SplitMix64 hash of
// `seed + i` falls at or above `rate`, and scaled by `1 / (1 - rate)`. The mask depends only
// on the seed and the position, so it is the same on every run and every grid.
extern "C" __global__ void dropout_f32(const float* x, float* out, float* mask, float rate,
                                       u64 seed, u64 n) {
    float keep = 1.0f / (1.0f - rate);
    FOR_EACH(i, n) {
        u64 z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        float m = u >= rate ? keep : 0.0f;
        mask[i] = m;
        out[i] = x[i] * m;
    }
}

// Plain SGD: `p -= lr · g`.
extern "C" __global__ void sgd_f32(float* params, const float* grads, float lr, u64 n) {
    FOR_EACH(i, n) { params[i] -= lr * grads[i]; }
}

// SGD with momentum as Keras applies it: `v = momentum · v - lr · g`, then `p += v` (or, with
// Nesterov, `p += momentum · v - lr · g`).
extern "C" __global__ void sgd_momentum_f32(float* params, const float* grads, float* velocity,
                                            float lr, float momentum, int nesterov, u64 n) {
    FOR_EACH(i, n) {
        float g = grads[i];
        float v = momentum * velocity[i] - lr * g;
        velocity[i] = v;
        params[i] += nesterov ? momentum * v - lr * g : v;
    }
}

// Adam as Keras applies it, with `alpha = lr · sqrt(1 - beta_2^t) / (1 - beta_1^t)` computed
// on the host: the same operations in the same order as lockstep-nn's CPU Adam.
extern "C" __global__ void adam_f32(float* params, const float* grads, float* m, float* v,
                                    float alpha, float beta_1, float beta_2, float epsilon,
                                    u64 n) {
    FOR_EACH(i, n) {
        float g = grads[i];
        float mi = m[i] + (g - m[i]) * (1.0f - beta_1);
        float vi = v[i] + (g * g - v[i]) * (1.0f - beta_2);
        m[i] = mi;
        v[i] = vi;
        params[i] -= mi * alpha / (sqrtf(vi) + epsilon);
    }
}
