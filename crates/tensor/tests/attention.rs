//! The tiled attention operation against the same attention composed of the plain operations
//! (batched products, a mask by `select`, softmax): values and gradients within 1e-5
//! relative, on sizes that cross the tiles' edges, with causal and padding masks and dropout.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_tensor::ops::{self, Attention, AttentionDropout};
use lockstep_tensor::{Tensor, TensorError};
use proptest::prelude::*;

/// Deterministic values in [-1, 1): a multiplicative hash of the index and a salt.
fn values(len: usize, salt: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| {
            let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
            let h = h ^ (h >> 29);
            ((h >> 40) as f32 / (1 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Attention composed of the plain operations, with the mask as a tensor broadcast to the
/// scores (causal folded in) and the dropout's factors, when given, as a tensor too.
fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: &Tensor,
    dropout: Option<&Tensor>,
) -> Result<Tensor, TensorError> {
    let depth = q.shape()[3] as f32;
    let scores = ops::scale(
        &ops::matmul(q, &ops::transpose(k, -2, -1)?)?,
        1.0 / depth.sqrt(),
    )?;
    let masked = ops::select(visible, &scores, &Tensor::scalar(-1e30))?;
    let mut weights = ops::softmax(&masked, -1)?;
    if let Some(factors) = dropout {
        weights = ops::mul(&weights, factors)?;
    }
    ops::matmul(&weights, v)
}

/// `visible[b, h, i, j]` as the operation reads it: causal, and the padding mask of example
/// `b` (its first `lengths[b]` keys).
fn visibility(shape: [usize; 4], causal: bool, lengths: &[usize]) -> Tensor {
    let [batch, heads, queries, keys] = shape;
    let mut data = Vec::with_capacity(batch * heads * queries * keys);
    for &length in &lengths[..batch] {
        for _ in 0..heads {
            for i in 0..queries {
                for j in 0..keys {
                    let seen = (!causal || j <= i) && j < length;
                    data.push(f32::from(u8::from(seen)));
                }
            }
        }
    }
    Tensor::from_vec(data, &shape).unwrap()
}

fn padding_mask(batch: usize, keys: usize, lengths: &[usize]) -> Tensor {
    let data = (0..batch)
        .flat_map(|b| (0..keys).map(move |j| (b, j)))
        .map(|(b, j)| f32::from(u8::from(j < lengths[b])))
        .collect();
    Tensor::from_vec(data, &[batch, 1, 1, keys]).unwrap()
}

/// Within 1e-5 of the larger of the value and the largest value of the result, or `floor`
/// (the rounding of the sums behind a value that cancels to about zero, as the keys' gradient
/// of a softmax over one key does).
fn close(op: &str, got: &[f32], want: &[f32], floor: f32) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    let largest = want.iter().fold(0.0_f32, |m, v| m.max(v.abs())).max(1e-3);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= 1e-5 * largest.max(w.abs()) + floor,
            "{} value {}: {} vs {} (largest {})",
            op,
            i,
            g,
            w,
            largest
        );
    }
    Ok(())
}

/// The operation's output and its gradients for `q`, `k`, `v` against the composed ones,
/// under a loss that weighs every output value differently.
fn compare(
    shape: (usize, usize, usize, usize, usize),
    causal: bool,
    lengths: &[usize],
    dropout: Option<AttentionDropout>,
) -> Result<(), TestCaseError> {
    let (batch, heads, queries, keys, depth) = shape;
    let q_shape = [batch, heads, queries, depth];
    let kv_shape = [batch, heads, keys, depth];
    let params = |salt| {
        let shape = if salt == 1 { q_shape } else { kv_shape };
        Tensor::parameter(values(shape.iter().product(), salt), &shape).unwrap()
    };
    let (q, k, v) = (params(1), params(2), params(3));
    let mask = padding_mask(batch, keys, lengths);
    let options = Attention {
        causal,
        mask: Some(&mask),
        dropout,
        ..Attention::default()
    };
    let tiled = ops::scaled_dot_product_attention(&q, &k, &v, &options).unwrap();
    let visible = visibility([batch, heads, queries, keys], causal, lengths);
    // The dropout's factors, read off the operation itself: attention with v = I per key
    // (value_depth = keys) returns each query's weights, dropped and scaled.
    let factors = dropout.map(|d| {
        let kept = 1.0 / (1.0 - d.rate);
        let eye: Vec<f32> = (0..batch * heads)
            .flat_map(|_| {
                (0..keys).flat_map(move |j| (0..keys).map(move |c| f32::from(u8::from(c == j))))
            })
            .collect();
        let eye = Tensor::from_vec(eye, &[batch, heads, keys, keys]).unwrap();
        let dropped =
            ops::scaled_dot_product_attention(&q.detach(), &k.detach(), &eye, &options).unwrap();
        let plain = ops::scaled_dot_product_attention(
            &q.detach(),
            &k.detach(),
            &eye,
            &Attention {
                dropout: None,
                ..options
            },
        )
        .unwrap();
        let f: Vec<f32> = dropped
            .host_data()
            .unwrap()
            .iter()
            .zip(plain.host_data().unwrap())
            .map(|(&d, &p)| if d == 0.0 || p == 0.0 { 0.0 } else { kept })
            .collect();
        Tensor::from_vec(f, dropped.shape()).unwrap()
    });
    let reference = composed(&q, &k, &v, &visible, factors.as_ref()).unwrap();
    close(
        "output",
        tiled.host_data().unwrap(),
        reference.host_data().unwrap(),
        1e-7,
    )?;
    let weights = Tensor::from_vec(values(tiled.len(), 9), tiled.shape()).unwrap();
    let loss =
        |y: &Tensor| ops::sum(&ops::mul(y, &weights).unwrap(), &[0, 1, 2, 3], false).unwrap();
    let (gt, gr) = (
        loss(&tiled).backward().unwrap(),
        loss(&reference).backward().unwrap(),
    );
    for (name, p) in [("dq", &q), ("dk", &k), ("dv", &v)] {
        close(
            name,
            gt.get(p).unwrap().host_data().unwrap(),
            gr.get(p).unwrap().host_data().unwrap(),
            1e-6,
        )?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn tiled_attention_equals_the_composed_operations(
        batch in 1..3_usize, heads in 1..3_usize, queries in prop::sample::select(vec![1_usize, 5, 64, 65, 130]),
        keys in prop::sample::select(vec![1_usize, 7, 64, 70, 129]), depth in 1..9_usize, causal: bool,
        cut in prop::collection::vec(0..1000_usize, 2),
    ) {
        // Causal attention pairs position i with key i: as many keys as queries.
        let keys = if causal { queries } else { keys };
        // Every example keeps at least its first key, so that no query sees nothing (where the
        // composed softmax gives NaN and the operation zeros).
        let lengths: Vec<usize> = cut.iter().map(|c| 1 + c * (keys - 1) / 1000).collect();
        compare((batch, heads, queries, keys, depth), causal, &lengths, None)?;
    }
}

#[test]
fn dropout_on_the_weights_equals_the_composed_operations_with_the_same_mask() {
    let dropout = AttentionDropout {
        rate: 0.3,
        seed: 11,
        first_example: 40,
    };
    compare((2, 2, 70, 70, 4), true, &[70, 33], Some(dropout)).unwrap();
}

#[test]
fn dropout_masks_follow_the_example_not_its_row_in_the_batch() {
    // Example 41 as row 1 of a batch from 40, and as row 0 of a batch from 41.
    let (q, k, v) = (
        Tensor::from_vec(values(2 * 8 * 4, 1), &[2, 1, 8, 4]).unwrap(),
        Tensor::from_vec(values(2 * 8 * 4, 2), &[2, 1, 8, 4]).unwrap(),
        Tensor::from_vec(values(2 * 8 * 4, 3), &[2, 1, 8, 4]).unwrap(),
    );
    let at = |first_example| Attention {
        dropout: Some(AttentionDropout {
            rate: 0.5,
            seed: 3,
            first_example,
        }),
        ..Attention::default()
    };
    let whole = ops::scaled_dot_product_attention(&q, &k, &v, &at(40)).unwrap();
    let second = |t: &Tensor| ops::narrow(t, 0, 1, 1).unwrap();
    let alone =
        ops::scaled_dot_product_attention(&second(&q), &second(&k), &second(&v), &at(41)).unwrap();
    assert_eq!(
        second(&whole).host_data().unwrap(),
        alone.host_data().unwrap()
    );
    let other = ops::scaled_dot_product_attention(&q, &k, &v, &at(0)).unwrap();
    assert_ne!(whole.host_data().unwrap(), other.host_data().unwrap());
}

#[test]
fn attention_gives_the_same_bits_on_every_run_and_thread_count() {
    let shape = [2, 3, 130, 16];
    let t = |salt| Tensor::parameter(values(shape.iter().product(), salt), &shape).unwrap();
    let (q, k, v) = (t(1), t(2), t(3));
    let options = Attention {
        causal: true,
        ..Attention::default()
    };
    let run = || {
        let y = ops::scaled_dot_product_attention(&q, &k, &v, &options).unwrap();
        let grads = ops::sum(&y, &[0, 1, 2, 3], false)
            .unwrap()
            .backward()
            .unwrap();
        let mut bits: Vec<u32> = y.host_data().unwrap().iter().map(|v| v.to_bits()).collect();
        for p in [&q, &k, &v] {
            bits.extend(
                grads
                    .get(p)
                    .unwrap()
                    .host_data()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits()),
            );
        }
        bits
    };
    let first = run();
    assert_eq!(first, run());
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(first, one_thread.install(run));
}

#[test]
fn a_query_that_sees_no_key_gets_zeros_and_no_gradient() {
    let q = Tensor::parameter(vec![1.0, 2.0], &[1, 1, 2, 1]).unwrap();
    let k = Tensor::parameter(vec![1.0, 1.0], &[1, 1, 2, 1]).unwrap();
    let v = Tensor::parameter(vec![3.0, 5.0], &[1, 1, 2, 1]).unwrap();
    // Query 0 may attend to nothing; query 1 to key 1 alone.
    let mask = Tensor::from_vec(vec![0.0, 0.0, 0.0, 1.0], &[2, 2]).unwrap();
    let options = Attention {
        mask: Some(&mask),
        ..Attention::default()
    };
    let y = ops::scaled_dot_product_attention(&q, &k, &v, &options).unwrap();
    assert_eq!(y.host_data().unwrap(), [0.0, 5.0]);
    let grads = ops::sum(&y, &[0, 1, 2, 3], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grads.get(&q).unwrap().host_data().unwrap(), [0.0, 0.0]);
    assert_eq!(grads.get(&v).unwrap().host_data().unwrap(), [0.0, 1.0]);
}

#[test]
fn bad_operands_are_errors_that_name_the_problem() {
    let t = |shape: &[usize]| Tensor::zeros(shape).unwrap();
    let plain = Attention::default();
    let err = |q: &Tensor, k: &Tensor, v: &Tensor, o: &Attention<'_>| {
        ops::scaled_dot_product_attention(q, k, v, o)
            .unwrap_err()
            .to_string()
    };
    let x = t(&[1, 2, 3, 4]);
    assert!(err(&t(&[2, 3, 4]), &x, &x, &plain).contains("[batch, heads, positions, depth]"));
    assert!(err(&x, &t(&[1, 2, 3, 5]), &x, &plain).contains("depth"));
    assert!(err(&x, &x, &t(&[1, 2, 4, 4]), &plain).contains("positions"));
    assert!(err(&t(&[1, 2, 3, 0]), &t(&[1, 2, 3, 0]), &x, &plain).contains("depth of zero"));
    let mask = t(&[2, 3]);
    let masked = Attention {
        mask: Some(&mask),
        ..plain
    };
    assert!(err(&x, &x, &x, &masked).contains("cannot broadcast"));
    let dropped = Attention {
        dropout: Some(AttentionDropout {
            rate: 1.0,
            seed: 0,
            first_example: 0,
        }),
        ..plain
    };
    assert!(err(&x, &x, &x, &dropped).contains("[0, 1)"));
}
