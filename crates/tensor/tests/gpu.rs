//! Every operation the models use, run on a GPU, against the same operation on the CPU: values
//! and gradients. Runs where a GPU is present; elsewhere each test is a skip that the log shows
//! (`LOCKSTEP_REQUIRE_GPU=1`, set by `cargo xtask gpu-check`'s runner, makes it a failure).
//!
//! Tolerance: `1e-4` relative to the largest value of each compared array. Element-wise work,
//! relu, bias and pooling are exact on the GPU; sums, `exp`/`log` and products (cuBLAS, im2col
//! against the CPU's Winograd or direct convolutions) round differently.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_tensor::ops::{self, MaxPool, Padding};
use lockstep_tensor::{Device, Tensor, TensorError};
use lockstep_testenv::{Need, available};
use proptest::prelude::*;

const GPU: Device = Device::Cuda(0);

/// Whether a GPU can be used; a skip that the log shows where not (a failure under
/// `LOCKSTEP_REQUIRE_GPU=1`).
fn gpu_present() -> bool {
    available(Need::Gpu, Tensor::scalar(1.0).to_device(GPU)).is_some()
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_cuda_feature_a_gpu_tensor_is_an_error_naming_the_feature() {
    let err = Tensor::scalar(1.0).to_device(GPU).unwrap_err();
    assert!(err.to_string().contains("`cuda` feature"), "{err}");
}

fn close(what: &str, gpu: &[f32], cpu: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(gpu.len(), cpu.len(), "{}: lengths", what);
    let scale = cpu.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        prop_assert!(
            (g - c).abs() <= 1e-4 * scale,
            "{} value {}: gpu {} vs cpu {}",
            what,
            i,
            g,
            c
        );
    }
    Ok(())
}

type Op<'a> = dyn Fn(&[Tensor]) -> Result<Tensor, TensorError> + 'a;

/// The values of `op` on `inputs`, and the gradients of a weighted sum of them with respect to
/// every input, computed on `device`.
fn run(inputs: &[(Vec<f32>, Vec<usize>)], op: &Op, device: Device) -> (Vec<f32>, Vec<Vec<f32>>) {
    let params: Vec<Tensor> = inputs
        .iter()
        .map(|(v, s)| {
            Tensor::parameter(v.clone(), s)
                .unwrap()
                .to_device(device)
                .unwrap()
        })
        .collect();
    let out = op(&params).unwrap();
    assert_eq!(
        out.device(),
        device,
        "the result stays on the operands' device"
    );
    let weights: Vec<f32> = (0..out.len()).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
    let weights = Tensor::from_vec(weights, out.shape())
        .unwrap()
        .to_device(device)
        .unwrap();
    let loss = ops::sum(
        &ops::mul(&out, &weights).unwrap(),
        &(0..out.rank()).collect::<Vec<_>>(),
        false,
    )
    .unwrap();
    let grads = loss.backward().unwrap();
    let grads = params
        .iter()
        .map(|p| {
            grads.get(p).map_or_else(Vec::new, |g| {
                assert_eq!(g.device(), device, "gradients stay on the device");
                g.to_vec().unwrap()
            })
        })
        .collect();
    (out.to_vec().unwrap(), grads)
}

fn same_on_both(inputs: &[(Vec<f32>, Vec<usize>)], op: &Op<'_>) -> Result<(), TestCaseError> {
    let (cpu, cpu_grads) = run(inputs, op, Device::Cpu);
    let (gpu, gpu_grads) = run(inputs, op, GPU);
    close("value", &gpu, &cpu)?;
    for (i, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        close(&format!("gradient of input {i}"), g, c)?;
    }
    Ok(())
}

fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((-2000_i32..2000).prop_map(|v| v as f32 / 1000.0), len)
}

#[test]
fn a_missing_gpu_is_an_error_naming_the_device_not_a_panic() {
    let x = Tensor::parameter(vec![1.0, 2.0], &[2]).unwrap();
    match x.to_device(GPU) {
        Ok(gpu) => {
            assert!(gpu.requires_grad(), "a parameter's copy is a parameter");
            assert_eq!(gpu.to_vec().unwrap(), [1.0, 2.0]);
            let err = ops::add(&x, &gpu).unwrap_err();
            assert!(err.to_string().contains("cuda:0"), "{err}");
            assert!(gpu.host_data().is_err());
            assert_eq!(gpu.to_host().unwrap().host_data().unwrap(), [1.0, 2.0]);
        }
        Err(e) => {
            assert!(
                matches!(e, TensorError::Device { device: GPU, .. }),
                "{e:?}"
            );
            assert!(e.to_string().starts_with("to_device on cuda:0"), "{e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn element_wise_operations_equal_the_cpus(a in values(60), b in values(60)) {
        if !gpu_present() {
            return Ok(());
        }
        let positive: Vec<f32> = b.iter().map(|v| v.abs() + 0.5).collect();
        let two = [(a.clone(), vec![6, 10]), (positive.clone(), vec![6, 10])];
        same_on_both(&two, &|t| ops::add(&t[0], &t[1]))?;
        same_on_both(&two, &|t| ops::sub(&t[0], &t[1]))?;
        same_on_both(&two, &|t| ops::mul(&t[0], &t[1]))?;
        same_on_both(&two, &|t| ops::div(&t[0], &t[1]))?;
        let one = [(a.clone(), vec![6, 10])];
        same_on_both(&one, &|t| ops::scale(&t[0], -1.5))?;
        same_on_both(&one, &|t| ops::relu(&t[0]))?;
        same_on_both(&one, &|t| ops::clip(&t[0], -0.5, 0.7))?;
        same_on_both(&one, &|t| ops::softmax(&t[0], -1))?;
        same_on_both(&[(positive, vec![6, 10])], &|t| ops::log(&t[0]))?;
        same_on_both(&one, &|t| ops::exp(&t[0]))?;
        same_on_both(&one, &|t| ops::abs(&t[0]))?;
        same_on_both(&one, &|t| ops::sigmoid(&t[0]))?;
        same_on_both(&[(a.clone(), vec![6, 10]), (b[..10].to_vec(), vec![10])], &|t| ops::bias_add(&t[0], &t[1]))?;
        same_on_both(&one, &|t| ops::mean(&t[0], &[0], false))?;
        same_on_both(&one, &|t| ops::sum(&t[0], &[0, 1], true))?;
        same_on_both(&one, &|t| ops::reshape(&ops::relu(&t[0])?, &[3, 20]))?;
    }

    #[test]
    fn products_and_the_loss_equal_the_cpus(x in values(8 * 30), w in values(30 * 10), b in values(10), relu: bool, labels in prop::collection::vec(0..10_usize, 8)) {
        if !gpu_present() {
            return Ok(());
        }
        let inputs = [(x, vec![8, 30]), (w, vec![30, 10]), (b, vec![10])];
        same_on_both(&inputs[..2], &|t| ops::matmul(&t[0], &t[1]))?;
        same_on_both(&inputs, &|t| ops::dense(&t[0], &t[1], Some(&t[2]), relu))?;
        same_on_both(&inputs, &|t| {
            let logits = ops::dense(&t[0], &t[1], Some(&t[2]), false)?;
            let per_example = ops::sparse_softmax_cross_entropy_with_logits(&logits, &labels)?;
            ops::mean(&per_example, &[0], false)
        })?;
    }

    #[test]
    fn sequence_model_operations_equal_the_cpus(a in values(60), b in values(60), mask in prop::collection::vec(any::<bool>(), 60)) {
        if !gpu_present() {
            return Ok(());
        }
        let one = [(a.clone(), vec![3, 4, 5])];
        same_on_both(&one, &|t| ops::tanh(&t[0]))?;
        same_on_both(&one, &|t| ops::gelu(&t[0], ops::Gelu::Exact))?;
        same_on_both(&one, &|t| ops::gelu(&t[0], ops::Gelu::Tanh))?;
        same_on_both(&one, &|t| ops::silu(&t[0]))?;
        let positive: Vec<f32> = b.iter().map(|v| v.abs() + 0.5).collect();
        same_on_both(&[(positive.clone(), vec![3, 4, 5])], &|t| ops::sqrt(&t[0]))?;
        same_on_both(&[(positive, vec![3, 4, 5])], &|t| ops::rsqrt(&t[0]))?;
        same_on_both(&one, &|t| ops::permute(&t[0], &[2, 0, 1]))?;
        same_on_both(&one, &|t| ops::transpose(&t[0], 0, 1))?;
        same_on_both(&one, &|t| ops::softmax(&t[0], 1))?;
        let condition: Vec<f32> = mask.iter().map(|&m| f32::from(u8::from(m))).collect();
        same_on_both(&[(a, vec![3, 4, 5]), (b, vec![3, 4, 5]), (condition, vec![3, 4, 5])], &|t| {
            ops::select(&t[2].detach(), &t[0], &t[1])
        })?;
    }

    #[test]
    fn convolution_pooling_and_dropout_equal_the_cpus(
        x in values(2 * 9 * 9 * 3), k in values(9 * 3 * 8), b in values(8), relu: bool, same: bool,
    ) {
        if !gpu_present() {
            return Ok(());
        }
        let padding = if same { Padding::Same } else { Padding::Valid };
        let inputs = [(x, vec![2, 9, 9, 3]), (k, vec![3, 3, 3, 8]), (b, vec![8])];
        same_on_both(&inputs, &|t| ops::conv2d_bias_relu(&t[0], &t[1], Some(&t[2]), relu, (1, 1), padding))?;
        same_on_both(&inputs[..2], &|t| ops::conv2d(&t[0], &t[1], (2, 2), padding))?;
        let pool = MaxPool { size: (2, 2), stride: (2, 2), padding: Padding::Valid };
        same_on_both(&inputs, &|t| ops::conv2d_bias_relu_max_pool(&t[0], &t[1], Some(&t[2]), relu, (1, 1), padding, pool))?;
        same_on_both(&inputs[..1], &|t| ops::max_pool2d(&t[0], (3, 3), (2, 2), Padding::Same))?;
        same_on_both(&inputs[..1], &|t| ops::flatten(&t[0]))?;
        // Masks differ between devices by design: a rate of 0 keeps every value on both.
        same_on_both(&inputs[..1], &|t| ops::dropout(&t[0], 0.0, 7))?;
    }
}
