use super::*;
use crate::kernels::conv::{Lowering, conv2d_backward, im2col_conv2d};
use crate::kernels::geometry::OutputGrad;
use crate::kernels::lanes::{LANES, Lanes};
use transform::Transform;

fn geometry(batch: usize, (height, width): (usize, usize), c: usize, pad: usize) -> Geometry {
    Geometry {
        batch,
        height,
        width,
        channels: c,
        kernel_h: 3,
        kernel_w: 3,
        stride_h: 1,
        stride_w: 1,
        pad_top: pad,
        pad_left: pad,
        out_h: height + 2 * pad - 2,
        out_w: width + 2 * pad - 2,
    }
}

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0) - 1.0)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 * scale, "{what}[{i}]: {g} vs {w}");
    }
}

/// `(batch, (height, width), channels, filters, padding)`.
type Case = (usize, (usize, usize), usize, usize, usize);

/// Sizes with partial tiles, chunks of several images and of one, and both paddings.
const CASES: [Case; 5] = [
    (3, (13, 13), 8, 16, 0),
    (2, (7, 10), 9, 8, 1),
    (5, (4, 4), 16, 8, 0),
    (1, (30, 30), 8, 8, 1),
    (20, (5, 6), 8, 12, 0),
];

#[test]
fn both_tilings_compute_the_convolution_im2col_computes() {
    for (batch, size, c, f, pad) in CASES {
        let g = geometry(batch, size, c, pad);
        let input = values(batch * size.0 * size.1 * c, 1);
        let kernel = values(9 * c * f, 2);
        let bias = values(f, 3);
        let (mut want, _) = im2col_conv2d(&input, &kernel, Some(&bias), f, &g).unwrap();
        for v in &mut want {
            *v = v.max(0.0);
        }
        for t in [Tiling::F2, Tiling::F4] {
            let got = conv2d(t, &input, &kernel, Some(&bias), true, f, &g);
            assert_close(&got, &want, &format!("F({}) forward {g:?}", t.m()));
        }
    }
}

const ALL: Wanted = Wanted {
    input: true,
    kernel: true,
    bias: true,
};

#[test]
fn both_tilings_compute_the_gradients_im2col_computes() {
    for (batch, size, c, f, pad) in CASES {
        let g = geometry(batch, size, c, pad);
        let input = values(batch * size.0 * size.1 * c, 4);
        let kernel = values(9 * c * f, 5);
        let d_out = values(batch * g.out_pixels() * f, 6);
        let (out, cols) = im2col_conv2d(&input, &kernel, None, f, &g).unwrap();
        let relu_output: Vec<f32> = out.iter().map(|v| v.max(0.0)).collect();
        let im2col = Lowering::Im2col(cols);
        for relu in [false, true] {
            let grad = OutputGrad {
                values: &d_out,
                relu_output: relu.then_some(&relu_output[..]),
            };
            let want = conv2d_backward(&im2col, &input, &kernel, grad, f, &g, ALL).unwrap();
            for t in [Tiling::F2, Tiling::F4] {
                let got = backward(t, &input, &kernel, OutputGradient::Whole(grad), f, &g, ALL);
                let what = format!("F({}) relu {relu} {g:?}", t.m());
                assert_close(&got.input.unwrap(), want.input.as_ref().unwrap(), &what);
                assert_close(&got.kernel.unwrap(), want.kernel.as_ref().unwrap(), &what);
                assert_close(&got.bias.unwrap(), want.bias.as_ref().unwrap(), &what);
            }
        }
    }
}

#[test]
fn only_the_wanted_gradients_are_computed() {
    let g = geometry(2, (6, 6), 8, 0);
    let (input, kernel) = (values(2 * 36 * 8, 1), values(9 * 8 * 8, 2));
    let d_out = values(2 * 16 * 8, 3);
    let grad = OutputGrad {
        values: &d_out,
        relu_output: None,
    };
    let kernel_only = Wanted {
        input: false,
        kernel: true,
        bias: false,
    };
    let grads = backward(
        Tiling::F2,
        &input,
        &kernel,
        OutputGradient::Whole(grad),
        8,
        &g,
        kernel_only,
    );
    assert!(grads.input.is_none() && grads.bias.is_none());
    let all = backward(
        Tiling::F2,
        &input,
        &kernel,
        OutputGradient::Whole(grad),
        8,
        &g,
        ALL,
    );
    assert_eq!(grads.kernel, all.kernel);
}

#[test]
fn results_are_bit_identical_on_one_and_two_threads() {
    let g = geometry(16, (13, 13), 32, 0);
    let input = values(16 * 13 * 13 * 32, 7);
    let kernel = values(9 * 32 * 64, 8);
    let d_out = values(16 * g.out_pixels() * 64, 9);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let out = conv2d(Tiling::F4, &input, &kernel, None, true, 64, &g);
            let grad = OutputGrad {
                values: &d_out,
                relu_output: Some(&out),
            };
            let grads = backward(
                Tiling::F4,
                &input,
                &kernel,
                OutputGradient::Whole(grad),
                64,
                &g,
                ALL,
            );
            (out.clone(), grads.input, grads.kernel, grads.bias)
        })
    };
    assert_eq!(run(1), run(2));
}

/// `Bᵀ` and `Aᵀ` as Lavin and Gray publish them, row-major.
#[rustfmt::skip]
const INPUT_F2: [f32; 16] = [
    1.0,  0.0, -1.0,  0.0,
    0.0,  1.0,  1.0,  0.0,
    0.0, -1.0,  1.0,  0.0,
    0.0,  1.0,  0.0, -1.0,
];
#[rustfmt::skip]
const OUTPUT_F2: [f32; 8] = [
    1.0, 1.0,  1.0,  0.0,
    0.0, 1.0, -1.0, -1.0,
];
#[rustfmt::skip]
const INPUT_F4: [f32; 36] = [
    4.0,  0.0, -5.0,  0.0, 1.0, 0.0,
    0.0, -4.0, -4.0,  1.0, 1.0, 0.0,
    0.0,  4.0, -4.0, -1.0, 1.0, 0.0,
    0.0, -2.0, -1.0,  2.0, 1.0, 0.0,
    0.0,  2.0, -1.0, -2.0, 1.0, 0.0,
    0.0,  4.0,  0.0, -5.0, 0.0, 1.0,
];
#[rustfmt::skip]
const OUTPUT_F4: [f32; 24] = [
    1.0, 1.0,  1.0, 1.0,  1.0, 0.0,
    0.0, 1.0, -1.0, 2.0, -2.0, 0.0,
    0.0, 1.0,  1.0, 4.0,  4.0, 0.0,
    0.0, 1.0, -1.0, 8.0, -8.0, 1.0,
];

/// Each lane `e` of position `j` holds `j + 10·e`: distinct, exact in `f32`.
fn probe<const N: usize>() -> [Lanes; N] {
    std::array::from_fn(|j| Lanes::from(std::array::from_fn(|e| (j + 10 * e) as f32)))
}

fn arrays(lanes: &[Lanes]) -> Vec<[f32; LANES]> {
    lanes.iter().map(|l| l.to_array()).collect()
}

/// `matrix [rows × N] · x` per lane.
fn times<const N: usize>(matrix: &[f32], rows: usize, x: &[Lanes; N]) -> Vec<[f32; LANES]> {
    let x = arrays(x);
    (0..rows)
        .map(|i| std::array::from_fn(|e| (0..N).map(|j| matrix[i * N + j] * x[j][e]).sum()))
        .collect()
}

/// `matrixᵀ · y` per lane, for an `N × cols` matrix.
fn times_transposed<const N: usize>(
    matrix: &[f32],
    cols: usize,
    y: &[Lanes; N],
) -> Vec<[f32; LANES]> {
    let y = arrays(y);
    (0..cols)
        .map(|j| std::array::from_fn(|e| (0..N).map(|i| matrix[i * cols + j] * y[i][e]).sum()))
        .collect()
}

fn check_transforms<T: Transform<M, S>, const M: usize, const S: usize>(
    input: &[f32],
    output: &[f32],
) {
    let (d, y) = (probe::<S>(), probe::<M>());
    assert_eq!(arrays(&T::input(d)), times(input, S, &d));
    assert_eq!(arrays(&T::input_adjoint(d)), times_transposed(input, S, &d));
    assert_eq!(arrays(&T::output(d)), times(output, M, &d));
    assert_eq!(
        arrays(&T::output_adjoint(y)),
        times_transposed(output, S, &y)
    );
}

#[test]
fn the_written_out_transforms_are_the_published_matrices() {
    check_transforms::<TransformF2, 2, 4>(&INPUT_F2, &OUTPUT_F2);
    check_transforms::<TransformF4, 4, 6>(&INPUT_F4, &OUTPUT_F4);
}

#[test]
fn the_tiling_follows_the_work_it_saves() {
    let g = geometry(1, (13, 13), 32, 0);
    assert_eq!(tiling(&g, 64).map(Tiling::m), Some(4), "11×11 outputs");
    assert_eq!(
        tiling(&geometry(1, (4, 4), 32, 0), 64).map(Tiling::m),
        Some(2)
    );
    assert!(
        tiling(&geometry(1, (3, 3), 32, 0), 64).is_none(),
        "one output"
    );
    assert!(
        tiling(&geometry(1, (28, 28), 1, 0), 32).is_none(),
        "one channel"
    );
    assert!(tiling(&g, 4).is_none(), "four filters");
    let strided = Geometry {
        stride_h: 2,
        stride_w: 2,
        out_h: 6,
        out_w: 6,
        ..g
    };
    assert!(tiling(&strided, 64).is_none(), "a stride");
}
