//! Batch normalization's affine map, an optional relu and non-overlapping max pooling in one
//! pass over NHWC input: what `BatchNormalization → relu → MaxPooling2D` computes, without
//! storing the full-size normalised activation. The forward pass writes the pooled values and
//! a one-byte argmax per value; the backward pass routes the pooled gradient to each input row
//! as it goes (the gradient of the pooling and the relu, never stored whole) into the two
//! passes of batch normalization's backward pass.
//!
//! The values are those of the three operations apart, bit for bit: the same `x · a + b` per
//! value, the same comparisons as [`super::pool::max_pool`] (the first maximum, NaN kept), the
//! relu on the pooled value, and the backward sums taken row by row in the same blocks as
//! [`super::batch_norm::gradient_sums`], with zeros where no gradient was routed.

use rayon::prelude::*;

use super::batch_norm::{RowGradient, gradient_sums_by_row, input_gradient_by_row};
use super::geometry::Geometry;
use super::window_max::{NO_POSITION, PooledGrad};

/// Pooled values and their argmax (row-major window positions) of `relu?(x · a[c] + b[c])`
/// pooled by `g`'s windows, which must not overlap (stride equal to the window, no padding)
/// and hold fewer than [`NO_POSITION`] positions.
pub(crate) fn forward(
    x: &[f32],
    (a, b): (&[f32], &[f32]),
    relu: bool,
    g: &Geometry,
) -> (Vec<f32>, Vec<u8>) {
    let c = g.channels;
    let image_in = g.height * g.width * c;
    let image_out = g.out_pixels() * c;
    let mut out = vec![f32::NEG_INFINITY; g.batch * image_out];
    let mut argmax = vec![NO_POSITION; g.batch * image_out];
    out.par_chunks_mut(image_out.max(1))
        .zip(argmax.par_chunks_mut(image_out.max(1)))
        .enumerate()
        .for_each(|(image, (out, arg))| {
            let image = &x[image * image_in..(image + 1) * image_in];
            forward_image(image, (a, b), relu, g, (out, arg));
        });
    (out, argmax)
}

/// [`forward`] of one image.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn forward_image(
    image: &[f32],
    (a, b): (&[f32], &[f32]),
    relu: bool,
    g: &Geometry,
    (out, arg): (&mut [f32], &mut [u8]),
) {
    let c = g.channels;
    for pixel in 0..g.out_pixels() {
        let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
        let (out, arg) = (
            &mut out[pixel * c..(pixel + 1) * c],
            &mut arg[pixel * c..(pixel + 1) * c],
        );
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                let (y, x) = (oy * g.kernel_h + ky, ox * g.kernel_w + kx);
                let from = (y * g.width + x) * c;
                let position = (ky * g.kernel_w + kx) as u8;
                let window = out.iter_mut().zip(arg.iter_mut());
                let values = image[from..from + c].iter().zip(a.iter().zip(b));
                for ((out, arg), (&v, (&a, &b))) in window.zip(values) {
                    let v = v * a + b;
                    // As `max_pool`: `>` keeps the first maximum; NaN propagates.
                    let take = (v > *out) | (v.is_nan() & !out.is_nan());
                    *out = if take { v } else { *out };
                    *arg = if take { position } else { *arg };
                }
            }
        }
        if relu {
            for out in out.iter_mut() {
                *out = out.max(0.0);
            }
        }
    }
}

/// The pooled gradient as the backward passes route it to input rows: zero where the relu
/// was zero, and each value's argmax widened to 32 bits, so that routing a row is one compare
/// and one select per channel (routing from the byte argmax and the relu's output directly
/// vectorizes into shuffles and masked loads, which cost more than this one pass over the
/// pooled values).
pub(crate) struct Routing {
    d: Vec<f32>,
    argmax: Vec<u32>,
}

impl Routing {
    pub(crate) fn new(grad: PooledGrad<'_>) -> Self {
        let d = match grad.relu_output {
            Some(pooled) => grad
                .values
                .par_iter()
                .zip(pooled)
                .map(|(&d, &p)| if p > 0.0 { d } else { 0.0 })
                .collect(),
            None => grad.values.to_vec(),
        };
        let argmax = grad.argmax.par_iter().map(|&a| u32::from(a)).collect();
        Self { d, argmax }
    }
}

/// The pooled gradient routed to the rows of `g`'s input.
struct Routed<'a> {
    routing: &'a Routing,
    g: &'a Geometry,
}

impl RowGradient for Routed<'_> {
    /// Writes the gradient reaching input row `row` (a pixel of `g`'s input, counted over the
    /// whole batch) from the pooled gradient: `0 + d` where the row is its window's argmax (and
    /// the relu passed), as the pooling's scatter onto zeros gives, and `0` elsewhere.
    #[inline(always)]
    fn fill(&self, row: usize, dy: &mut [f32]) {
        let g = self.g;
        let pixels = g.height * g.width;
        let (image, pixel) = (row / pixels, row % pixels);
        let (y, x) = (pixel / g.width, pixel % g.width);
        let (py, px) = (y / g.kernel_h, x / g.kernel_w);
        if py >= g.out_h || px >= g.out_w {
            // Past the last whole window (a size the window does not divide): no gradient.
            dy.fill(0.0);
            return;
        }
        let position = ((y % g.kernel_h) * g.kernel_w + x % g.kernel_w) as u32;
        let c = g.channels;
        let at = ((image * g.out_h + py) * g.out_w + px) * c;
        let (d, argmax) = (
            &self.routing.d[at..at + c],
            &self.routing.argmax[at..at + c],
        );
        for ((dy, &d), &arg) in dy[..c].iter_mut().zip(d).zip(argmax) {
            // `d` kept by a mask of ones, not selected by a branch, which compiles to masked
            // loads; `+ 0.0` as the scatter onto zeros adds it (a −0.0 becomes 0.0).
            let keep = 0_u32.wrapping_sub(u32::from(arg == position));
            *dy = f32::from_bits(d.to_bits() & keep) + 0.0;
        }
    }
}

/// Per channel, `Σdy` and `Σdy · x̂` over the input rows, `dy` routed from the pooled gradient.
pub(crate) fn gradient_sums(
    routing: &Routing,
    x: &[f32],
    (mean, inverse_deviation): (&[f32], &[f32]),
    g: &Geometry,
) -> (Vec<f64>, Vec<f64>) {
    gradient_sums_by_row(x, mean, inverse_deviation, &Routed { routing, g })
}

/// The input gradient `dy · a[c] + k1[c] + x · k2[c]`, `dy` routed from the pooled gradient.
pub(crate) fn input_gradient(
    routing: &Routing,
    x: &[f32],
    a: &[f32],
    k: (&[f32], &[f32]),
    g: &Geometry,
) -> Vec<f32> {
    input_gradient_by_row(x, a, k, &Routed { routing, g })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::batch_norm::{affine, gradient_sums as whole_sums};
    use crate::kernels::pool::{max_pool, max_pool_grad};

    /// A 2×2 pooling over `[batch, height, width, channels]`.
    fn geometry(batch: usize, height: usize, width: usize, channels: usize) -> Geometry {
        Geometry {
            batch,
            height,
            width,
            channels,
            kernel_h: 2,
            kernel_w: 2,
            stride_h: 2,
            stride_w: 2,
            pad_top: 0,
            pad_left: 0,
            out_h: height / 2,
            out_w: width / 2,
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i + seed) * 7919) % 101) as f32 / 17.0 - 3.0)
            .collect()
    }

    #[test]
    fn fused_passes_give_the_bits_of_the_operations_apart() {
        // Odd sizes leave a row and a column outside every window; 5 images × 7 × 5 pixels
        // span several blocks of rows.
        let g = geometry(40, 7, 5, 3);
        let x = values(g.batch * g.height * g.width * g.channels, 1);
        let (a, b) = ([0.5, -1.5, 2.0], [0.25, 1.0, -0.5]);
        let (mean, inverse) = ([0.1, -0.2, 0.3], [1.5, 0.5, 2.0]);
        let (k1, k2) = ([0.01, 0.02, -0.03], [0.5, -0.25, 0.125]);
        for relu in [false, true] {
            let (pooled, argmax) = forward(&x, (&a, &b), relu, &g);
            // Apart: the affine map, max pooling, then the relu.
            let y = affine(&x, &a, &b, None);
            let (apart, apart_argmax) = max_pool(&y, &g);
            let apart: Vec<f32> = apart
                .iter()
                .map(|&v| if relu { v.max(0.0) } else { v })
                .collect();
            assert_eq!(pooled, apart);
            let d = values(pooled.len(), 5);
            let grad = PooledGrad {
                values: &d,
                relu_output: relu.then_some(&pooled[..]),
                argmax: &argmax,
            };
            let masked: Vec<f32> = d
                .iter()
                .zip(&pooled)
                .map(|(&d, &p)| if !relu || p > 0.0 { d } else { 0.0 })
                .collect();
            let dy = max_pool_grad(&masked, &apart_argmax, &g);
            let routing = Routing::new(grad);
            assert_eq!(
                gradient_sums(&routing, &x, (&mean, &inverse), &g),
                whole_sums(&dy, &x, &mean, &inverse)
            );
            assert_eq!(
                input_gradient(&routing, &x, &a, (&k1, &k2), &g),
                affine(&dy, &a, &k1, Some((&x, &k2)))
            );
        }
    }

    #[test]
    fn a_window_of_nan_keeps_it_and_routes_its_gradient() {
        let g = geometry(1, 2, 2, 1);
        let x = [1.0, f32::NAN, 3.0, 2.0];
        let (pooled, argmax) = forward(&x, (&[1.0], &[0.0]), false, &g);
        assert!(pooled[0].is_nan());
        assert_eq!(argmax, [1]);
        let grad = PooledGrad {
            values: &[2.0],
            relu_output: None,
            argmax: &argmax,
        };
        // All of the gradient reached the NaN's row: Σdy is the pooled gradient.
        let routing = Routing::new(grad);
        let (sum_dy, _) = gradient_sums(&routing, &x, (&[0.0], &[1.0]), &g);
        assert_eq!(sum_dy, [2.0]);
        let dx = input_gradient(&routing, &x, &[1.0], (&[0.0], &[0.0]), &g);
        assert_eq!([dx[0], dx[2], dx[3]], [0.0; 3]);
    }
}
