//! Max pooling in NHWC layout.

use rayon::prelude::*;

use super::geometry::Geometry;

/// Forward max pooling: `(output [batch, out_h, out_w, channels], argmax)`, where `argmax[i]`
/// is the index within its image of the input value output `i` took. A window entirely in the
/// padding yields `-inf` and routes no gradient.
pub(crate) fn max_pool(input: &[f32], g: &Geometry) -> (Vec<f32>, Vec<u32>) {
    let c = g.channels;
    let image_in = g.height * g.width * c;
    let image_out = g.out_pixels() * c;
    let mut out = vec![f32::NEG_INFINITY; g.batch * image_out];
    let mut argmax = vec![u32::MAX; g.batch * image_out];
    out.par_chunks_mut(image_out)
        .zip(argmax.par_chunks_mut(image_out))
        .enumerate()
        .for_each(|(b, (out, arg))| {
            let image = &input[b * image_in..(b + 1) * image_in];
            max_pool_image(image, g, (out, arg));
        });
    (out, argmax)
}

/// [`max_pool`] of one image.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn max_pool_image(image: &[f32], g: &Geometry, (out, arg): (&mut [f32], &mut [u32])) {
    let c = g.channels;
    for pixel in 0..g.out_pixels() {
        let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
        let (out, arg) = (
            &mut out[pixel * c..(pixel + 1) * c],
            &mut arg[pixel * c..(pixel + 1) * c],
        );
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                let Some((y, x)) = g.source(oy, ox, ky, kx) else {
                    continue;
                };
                let from = (y * g.width + x) * c;
                let window = out.iter_mut().zip(arg.iter_mut());
                for (ch, ((out, arg), &v)) in window.zip(&image[from..from + c]).enumerate() {
                    // `>` keeps the first maximum, as TensorFlow does; NaN propagates.
                    // Selects rather than branches, so the channel loop vectorises.
                    let take = (v > *out) | (v.is_nan() & !out.is_nan());
                    *out = if take { v } else { *out };
                    *arg = if take { (from + ch) as u32 } else { *arg };
                }
            }
        }
    }
}

/// Gradient of max pooling: routes each output gradient to the input its max came from.
pub(crate) fn max_pool_grad(d_out: &[f32], argmax: &[u32], g: &Geometry) -> Vec<f32> {
    let image_in = g.height * g.width * g.channels;
    let image_out = g.out_pixels() * g.channels;
    let mut d_in = vec![0.0_f32; g.batch * image_in];
    d_in.par_chunks_mut(image_in)
        .enumerate()
        .for_each(|(b, d_in)| {
            let range = b * image_out..(b + 1) * image_out;
            for (&d, &a) in d_out[range.clone()].iter().zip(&argmax[range]) {
                if let Some(slot) = d_in.get_mut(a as usize) {
                    *slot += d;
                }
            }
        });
    d_in
}

/// How many inputs of window (`oy`, `ox`) lie inside the image: the divisor of an average
/// over the valid inputs only (TensorFlow's `same` average pooling ignores the padding).
fn window_inputs(g: &Geometry, oy: usize, ox: usize) -> usize {
    let mut count = 0;
    for ky in 0..g.kernel_h {
        for kx in 0..g.kernel_w {
            count += usize::from(g.source(oy, ox, ky, kx).is_some());
        }
    }
    count
}

/// Forward average pooling: each output the mean of its window's inputs inside the image (0
/// for a window entirely in the padding), summed in window order.
pub(crate) fn avg_pool(input: &[f32], g: &Geometry) -> Vec<f32> {
    let c = g.channels;
    let image_in = g.height * g.width * c;
    let image_out = g.out_pixels() * c;
    let mut out = vec![0.0_f32; g.batch * image_out];
    out.par_chunks_mut(image_out.max(1))
        .enumerate()
        .for_each(|(b, out)| {
            let image = &input[b * image_in..(b + 1) * image_in];
            for pixel in 0..g.out_pixels() {
                let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
                let out = &mut out[pixel * c..(pixel + 1) * c];
                for ky in 0..g.kernel_h {
                    for kx in 0..g.kernel_w {
                        let Some((y, x)) = g.source(oy, ox, ky, kx) else {
                            continue;
                        };
                        let from = (y * g.width + x) * c;
                        for (o, &v) in out.iter_mut().zip(&image[from..from + c]) {
                            *o += v;
                        }
                    }
                }
                let count = window_inputs(g, oy, ox);
                if count > 0 {
                    let inverse = 1.0 / count as f32;
                    for o in out.iter_mut() {
                        *o *= inverse;
                    }
                }
            }
        });
    out
}

/// Gradient of average pooling: each output's gradient shared equally among its window's
/// inputs inside the image.
pub(crate) fn avg_pool_grad(d_out: &[f32], g: &Geometry) -> Vec<f32> {
    let c = g.channels;
    let image_in = g.height * g.width * c;
    let image_out = g.out_pixels() * c;
    let mut d_in = vec![0.0_f32; g.batch * image_in];
    d_in.par_chunks_mut(image_in.max(1))
        .enumerate()
        .for_each(|(b, d_in)| {
            let d_out = &d_out[b * image_out..(b + 1) * image_out];
            for pixel in 0..g.out_pixels() {
                let (oy, ox) = (pixel / g.out_w, pixel % g.out_w);
                let count = window_inputs(g, oy, ox);
                if count == 0 {
                    continue;
                }
                let inverse = 1.0 / count as f32;
                let d = &d_out[pixel * c..(pixel + 1) * c];
                for ky in 0..g.kernel_h {
                    for kx in 0..g.kernel_w {
                        let Some((y, x)) = g.source(oy, ox, ky, kx) else {
                            continue;
                        };
                        let from = (y * g.width + x) * c;
                        for (slot, &v) in d_in[from..from + c].iter_mut().zip(d) {
                            *slot += v * inverse;
                        }
                    }
                }
            }
        });
    d_in
}
