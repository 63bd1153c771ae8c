//! The layers beyond the tutorials' — `LayerNormalization`, `GlobalAveragePooling2D` — against
//! values computed by hand, every variable's gradient against central finite differences, and
//! their configurations through JSON.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::{
    Concatenate, Conv2D, Dense, Embedding, Flatten, ForwardContext, GlobalAveragePooling2D, Input,
    LayerCall, LayerNormalization, Network,
};
use lockstep_tensor::{Tensor, ops};

fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

/// `Σ output · weights` of `model` on `x`.
fn weighted_output(model: &Network, x: &Tensor) -> f64 {
    let out = model.predict(x).unwrap().to_vec().unwrap();
    out.iter()
        .enumerate()
        .map(|(i, &o)| f64::from(o) * (((i * 7 + 3) % 11) as f64 / 5.0 - 1.0))
        .sum()
}

/// Every variable's gradient of [`weighted_output`] against central differences.
fn check_gradients(mut model: Network, x: &Tensor) {
    let forward = model.forward(x, ForwardContext::default()).unwrap();
    let n = forward.output.len();
    let weights: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + 3) % 11) as f32 / 5.0 - 1.0)
        .collect();
    let r = tensor(&weights, forward.output.shape());
    let axes: Vec<usize> = (0..forward.output.rank()).collect();
    let loss = ops::sum(&ops::mul(&forward.output, &r).unwrap(), &axes, false).unwrap();
    let mut analytic = vec![0.0; model.parameters().len()];
    model
        .gradients(&forward, &loss.backward().unwrap(), &mut analytic)
        .unwrap();
    let h = 1e-2_f32;
    for (i, &slope) in analytic.iter().enumerate() {
        let original = model.parameters().values()[i];
        model.parameters_mut().values_mut()[i] = original + h;
        let up = weighted_output(&model, x);
        model.parameters_mut().values_mut()[i] = original - h;
        let down = weighted_output(&model, x);
        model.parameters_mut().values_mut()[i] = original;
        let numeric = (up - down) / (2.0 * f64::from(h));
        assert!(
            (f64::from(slope) - numeric).abs() <= 2e-2 * (1.0 + numeric.abs()),
            "variable value {i}: analytic {slope} numeric {numeric}"
        );
    }
}

#[test]
fn layer_normalization_gives_each_example_mean_zero_and_variance_one() {
    let inputs = Input::new(&[3]);
    let outputs = LayerNormalization::new().call(&inputs).unwrap();
    let model = Network::new(&[&inputs], &[&outputs], 0).unwrap();
    let y = model
        .predict(&tensor(&[1.0, 2.0, 3.0, 4.0, 4.0, 4.0], &[2, 3]))
        .unwrap()
        .to_vec()
        .unwrap();
    let scale = 1.0 / (2.0_f64 / 3.0 + 1e-3).sqrt();
    for (got, want) in y.iter().zip([-scale, 0.0, scale, 0.0, 0.0, 0.0]) {
        assert!((f64::from(*got) - want).abs() < 1e-5, "{y:?}");
    }
    assert_eq!(
        model
            .parameters()
            .view("layer_normalization/gamma")
            .unwrap(),
        [1.0; 3]
    );
}

#[test]
fn global_average_pooling_averages_each_channel_over_the_image() {
    let inputs = Input::new(&[2, 2, 2]);
    let outputs = GlobalAveragePooling2D.call(&inputs).unwrap();
    assert_eq!(outputs.shape(), [2]);
    let model = Network::new(&[&inputs], &[&outputs], 0).unwrap();
    let x = tensor(&[1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0], &[1, 2, 2, 2]);
    assert_eq!(model.predict(&x).unwrap().to_vec().unwrap(), [2.5, 25.0]);
    assert!(GlobalAveragePooling2D.call(&Input::new(&[4])).is_err());
}

#[test]
fn every_variable_of_the_new_layers_has_the_gradient_of_its_values() {
    let inputs = Input::new(&[6]);
    let h = Dense::new(5).call(&inputs).unwrap();
    let h = LayerNormalization::new().call(&h).unwrap();
    let outputs = Dense::new(3).call(&h).unwrap();
    let model = Network::new(&[&inputs], &[&outputs], 3).unwrap();
    let x = tensor(
        &(0..24)
            .map(|i| ((i * 5) % 13) as f32 / 6.0 - 1.0)
            .collect::<Vec<_>>(),
        &[4, 6],
    );
    check_gradients(model, &x);

    let image = Input::new(&[5, 5, 2]);
    let c = Conv2D::new(3, (3, 3)).call(&image).unwrap();
    let g = GlobalAveragePooling2D.call(&c).unwrap();
    let outputs = Dense::new(2).call(&g).unwrap();
    let model = Network::new(&[&image], &[&outputs], 1).unwrap();
    let x = tensor(
        &(0..100)
            .map(|i| ((i * 3) % 17) as f32 / 8.0 - 1.0)
            .collect::<Vec<_>>(),
        &[2, 5, 5, 2],
    );
    check_gradients(model, &x);
}

#[test]
fn the_new_layers_rebuild_from_their_configurations() {
    let inputs = Input::new(&[4, 4, 3]);
    let x = GlobalAveragePooling2D.call(&inputs).unwrap();
    let x = LayerNormalization::new().epsilon(1e-5).call(&x).unwrap();
    let model = Network::new(&[&inputs], &[&x], 2).unwrap();
    let json = serde_json::to_string(&model.config()).unwrap();
    assert!(
        json.contains(r#"{"class_name":"LayerNormalization","config":{"epsilon":0.00001}}"#),
        "{json}"
    );
    let again = Network::from_config(&serde_json::from_str(&json).unwrap(), 2).unwrap();
    assert_eq!(again.summary(), model.summary());
}

#[test]
fn an_embedding_looks_up_rows_and_its_gradient_reaches_only_those_looked_up() {
    let build = || {
        let ids = Input::new(&[3]);
        let vectors = Embedding::new(5, 2).call(&ids).unwrap();
        let flat = Flatten.call(&vectors).unwrap();
        let outputs = Dense::new(1).call(&flat).unwrap();
        Network::new(&[&ids], &[&outputs], 4).unwrap()
    };
    let model = build();
    let x = tensor(&[4.0, 1.0, 4.0, 0.0, 0.0, 1.0], &[2, 3]);
    let forward = model.forward(&x, ForwardContext::default()).unwrap();
    let axes: Vec<usize> = (0..forward.output.rank()).collect();
    let loss = ops::sum(&forward.output, &axes, false).unwrap();
    let mut grads = vec![0.0; model.parameters().len()];
    model
        .gradients(&forward, &loss.backward().unwrap(), &mut grads)
        .unwrap();
    let table = model.parameters().specs()[0].range();
    let rows: Vec<&[f32]> = grads[table].chunks(2).collect();
    assert!(rows[2].iter().chain(rows[3]).all(|&g| g == 0.0), "{rows:?}");
    assert!(rows[4].iter().any(|&g| g != 0.0), "{rows:?}");
    check_gradients(build(), &x);
    let err = model
        .predict(&tensor(&[5.0, 0.0, 0.0], &[1, 3]))
        .unwrap_err();
    assert!(err.to_string().contains("input_dim 5"), "{err}");
    let err = model
        .predict(&tensor(&[0.5, 0.0, 0.0], &[1, 3]))
        .unwrap_err();
    assert!(err.to_string().contains("not an id"), "{err}");
    // Ids are whole f32s: a table with more rows than they count exactly is refused.
    let ids = Input::new(&[1]);
    let err = Embedding::new(Embedding::MAX_IDS + 1, 1)
        .call(&ids)
        .unwrap_err();
    assert!(err.to_string().contains("exact only up to 2^24"), "{err}");
}

#[test]
fn two_inputs_of_ids_and_features_meet_in_one_model() {
    // A recommender's shape: an item id embedded, joined with dense features.
    let item = Input::named(&[1], "item");
    let features = Input::named(&[4], "features");
    let vectors = Embedding::new(50, 3).call(&item).unwrap();
    let vectors = Flatten.call(&vectors).unwrap();
    let joined = Concatenate.call_on(&[&vectors, &features]).unwrap();
    let outputs = Dense::new(1).call(&joined).unwrap();
    let model = Network::new(&[&item, &features], &[&outputs], 0).unwrap();
    let out = model
        .predict_inputs(&[tensor(&[7.0, 49.0], &[2, 1]), tensor(&[0.5; 8], &[2, 4])])
        .unwrap();
    assert_eq!(out[0].shape(), [2, 1]);
    assert!(model.summary().contains("embedding (Embedding)"));
}

#[test]
fn a_pass_as_ready_takes_each_variable_after_ready_has_changed_it() {
    let make = || {
        lockstep_nn::Sequential::new(
            &[4],
            vec![Box::new(Dense::new(3)), Box::new(Dense::new(2))],
            5,
        )
        .unwrap()
    };
    let x = Tensor::from_vec((0..8).map(|i| i as f32 / 8.0).collect(), &[2, 4]).unwrap();
    // The first layer's kernel and bias (variables 0 and 1) zeroed before the pass.
    let mut expected = make();
    let first = expected.parameters().specs()[1].range().end;
    expected.parameters_mut().values_mut()[..first].fill(0.0);
    let want = expected.forward(&x, ForwardContext::default()).unwrap();
    let mut model = make();
    let mut ends = Vec::new();
    let got = model
        .forward_inputs_as_ready(
            std::slice::from_ref(&x),
            ForwardContext::default(),
            &mut |values, params| {
                if ends.is_empty() {
                    params.values_mut()[..first].fill(0.0);
                }
                ends.push(values);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(got.output.to_vec().unwrap(), want.output.to_vec().unwrap());
    // The first layer's variables first, every value by the end, each once, in order.
    assert_eq!(ends.first(), Some(&(0..first)));
    assert_eq!(ends.last().map(|r| r.end), Some(model.parameters().len()));
    assert!(ends.windows(2).all(|w| w[0].end == w[1].start), "{ends:?}");
    // What `ready` wrote stays in the model; its gradients are the whole pass's.
    assert!(
        model.parameters().values()[..first]
            .iter()
            .all(|&v| v == 0.0)
    );
    let mut grads = vec![0.0; model.parameters().len()];
    let loss = lockstep_tensor::ops::sum(&got.output, &[0, 1], false).unwrap();
    model
        .gradients(&got, &loss.backward().unwrap(), &mut grads)
        .unwrap();
    assert!(grads.iter().any(|&g| g != 0.0));
    // An error from `ready` stops the pass and leaves the values in place.
    let before = model.parameters().values().to_vec();
    let failed = model.forward_inputs_as_ready(
        std::slice::from_ref(&x),
        ForwardContext::default(),
        &mut |_, _| {
            Err(lockstep_nn::NnError::InvalidConfig {
                layer: "test".into(),
                why: "not ready".into(),
            })
        },
    );
    let Err(err) = failed else {
        panic!("a pass whose variables are never ready ran");
    };
    assert!(err.to_string().contains("not ready"), "{err}");
    assert_eq!(model.parameters().values(), &before[..]);
}

/// A model whose first dense kernel (1200 × 128) is summed in three blocks of rows.
fn large_dense_model() -> lockstep_nn::Sequential {
    lockstep_nn::Sequential::new(
        &[1200],
        vec![
            Box::new(Dense::new(128).activation(lockstep_nn::Activation::Relu)),
            Box::new(Dense::new(3)),
        ],
        9,
    )
    .unwrap()
}

/// Two inputs of [`large_dense_model`], values from `(i · step) mod period`.
fn large_dense_input(step: usize, period: usize) -> Tensor {
    let values = (0..2 * 1200).map(|i| ((i * step) % period) as f32 / period as f32 - 0.4);
    Tensor::from_vec(values.collect(), &[2, 1200]).unwrap()
}

#[test]
fn a_pass_as_ready_takes_a_large_kernel_block_by_block_with_the_bits_of_a_whole_pass() {
    let x = large_dense_input(7, 13);
    // The kernel halved before the pass, as an update landing would change it.
    let mut expected = large_dense_model();
    let kernel = expected.parameters().specs()[0].range();
    let bias = expected.parameters().specs()[1].range();
    for v in &mut expected.parameters_mut().values_mut()[kernel.clone()] {
        *v *= 0.5;
    }
    let want = expected.forward(&x, ForwardContext::default()).unwrap();
    let mut model = large_dense_model();
    let mut asked: Vec<std::ops::Range<usize>> = Vec::new();
    let got = model
        .forward_inputs_as_ready(
            std::slice::from_ref(&x),
            ForwardContext::default(),
            &mut |values, params| {
                // Each block is changed only when it is asked for.
                if values.start < kernel.end {
                    for v in &mut params.values_mut()[values.clone()] {
                        *v *= 0.5;
                    }
                }
                asked.push(values);
                Ok(())
            },
        )
        .unwrap();
    let bits =
        |t: &Tensor| -> Vec<u32> { t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect() };
    assert_eq!(bits(&got.output), bits(&want.output));
    // The bias, then the kernel's blocks, the last rows first, then the last layer.
    let blocks: Vec<_> = lockstep_tensor::ops::dense_blocks(1200, 128)
        .into_iter()
        .map(|rows| rows.start * 128..rows.end * 128)
        .collect();
    assert_eq!(blocks.len(), 3);
    assert_eq!(asked[0], bias);
    assert_eq!(asked[1..4], blocks[..]);
    assert_eq!(asked[4], bias.end..model.parameters().len());
    assert_eq!(asked.len(), 5);
    // Its gradients are those of the same pass on the whole kernel.
    let grads = |forward: &lockstep_nn::Forward, net: &lockstep_nn::Sequential| {
        let loss = lockstep_tensor::ops::sum(&forward.output, &[0, 1], false).unwrap();
        let mut out = vec![0.0; net.parameters().len()];
        net.gradients(forward, &loss.backward().unwrap(), &mut out)
            .unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(grads(&got, &model), grads(&want, &expected));
}

#[test]
fn streamed_gradients_hand_over_a_large_kernel_block_by_block_on_one_thread() {
    let model = large_dense_model();
    let x = large_dense_input(5, 11);
    let n = model.parameters().len();
    let kernel = model.parameters().specs()[0].range();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (streamed, handed) = pool.install(|| {
        let forward = model.forward(&x, ForwardContext::default()).unwrap();
        let loss = lockstep_tensor::ops::sum(&forward.output, &[0, 1], false).unwrap();
        let mut out = vec![f32::NAN; n];
        let mut handed = Vec::new();
        model
            .gradients_streamed(&forward, &loss, &mut out, &mut |_, values| {
                handed.push(values);
            })
            .unwrap();
        (out, handed)
    });
    let forward = model.forward(&x, ForwardContext::default()).unwrap();
    let loss = lockstep_tensor::ops::sum(&forward.output, &[0, 1], false).unwrap();
    let mut whole = vec![0.0; n];
    model
        .gradients(&forward, &loss.backward().unwrap(), &mut whole)
        .unwrap();
    assert_eq!(streamed, whole);
    // Every value in exactly one range; the kernel's in its three blocks.
    let mut covered = vec![0; n];
    for range in &handed {
        for c in &mut covered[range.clone()] {
            *c += 1;
        }
    }
    assert!(covered.iter().all(|&c| c == 1), "{handed:?}");
    let in_kernel = handed
        .iter()
        .filter(|r| r.start >= kernel.start && r.end <= kernel.end);
    assert_eq!(in_kernel.count(), 3, "{handed:?}");
}
