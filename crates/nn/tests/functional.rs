//! The functional API: graphs with branches, merges and several inputs and outputs, shape
//! checks where a layer is called, `summary()` with what each layer is connected to,
//! configurations that rebuild the graph, and a chain that trains bit for bit as the
//! `Sequential` model of the same layers.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::{
    Activation, Add, Concatenate, Conv2D, Dense, Embedding, Flatten, ForwardContext, Input, Layer,
    LayerCall, MaxPooling2D, ModelConfig, Multiply, Network, NnError, Optimizer, Reduction,
    RowLookup, Sequential, Sgd, SparseCategoricalCrossentropy,
};
use lockstep_tensor::Tensor;
use lockstep_tensor::ops;

fn batch(rows: usize, cols: usize, seed: usize) -> Tensor {
    let values = (0..rows * cols)
        .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
        .collect();
    Tensor::from_vec(values, &[rows, cols]).unwrap()
}

fn relu_dense(units: usize) -> Dense {
    Dense::new(units).activation(Activation::Relu)
}

/// Trains `model` for `steps` SGD steps on one batch (a model with the capacity to memorise
/// it must lower its loss); returns the losses.
fn train(model: &mut Network, steps: u64) -> Vec<f32> {
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let mut sgd = Sgd::new(0.1);
    let mut losses = Vec::new();
    for step in 0..steps {
        let x = batch(16, model.input_shape()[0], 0);
        let labels: Vec<usize> = (0..16).map(|i| (i * 7) % 10).collect();
        let ctx = ForwardContext::training(step, 0);
        let forward = model.forward(&x, ctx).unwrap();
        let loss = loss_fn.call(&forward.output, &labels).unwrap();
        losses.push(loss.item().unwrap());
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        sgd.apply(model.parameters_mut().values_mut(), &grads)
            .unwrap();
    }
    losses
}

fn guide_model(seed: u64) -> Network {
    let inputs = Input::named(&[784], "digits");
    let x = relu_dense(64).named("dense_1").call(&inputs).unwrap();
    let x = relu_dense(64).named("dense_2").call(&x).unwrap();
    let outputs = Dense::new(10).named("predictions").call(&x).unwrap();
    Network::new(&[&inputs], &[&outputs], seed).unwrap()
}

#[test]
fn the_guides_functional_mlp_builds_with_its_names_and_shapes() {
    let model = guide_model(0);
    assert_eq!(model.input_shape(), [784]);
    assert_eq!(model.output_shape(), [10]);
    assert_eq!(
        model.parameters().len(),
        784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
    );
    let names: Vec<&str> = model
        .parameters()
        .specs()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "dense_1/kernel",
            "dense_1/bias",
            "dense_2/kernel",
            "dense_2/bias",
            "predictions/kernel",
            "predictions/bias"
        ]
    );
    let summary = model.summary();
    for want in [
        "Model: \"functional\"",
        "Connected to",
        "digits (InputLayer)",
        "dense_1 (Dense)",
        "digits[0][0]",
        "predictions (Dense)",
        "dense_2[0][0]",
        "Total params: 55050",
    ] {
        assert!(summary.contains(want), "{want:?} missing from\n{summary}");
    }
}

#[test]
fn a_functional_chain_trains_bit_for_bit_as_the_same_sequential_model() {
    let layers = || -> Vec<Box<dyn Layer>> {
        vec![
            Box::new(relu_dense(32)),
            Box::new(relu_dense(32)),
            Box::new(Dense::new(10)),
        ]
    };
    let mut sequential: Network = Sequential::new(&[20], layers(), 5).unwrap().into();
    let inputs = Input::new(&[20]);
    let mut x = inputs.clone();
    for layer in [relu_dense(32), relu_dense(32), Dense::new(10)] {
        x = layer.call(&x).unwrap();
    }
    let mut functional = Network::new(&[&inputs], &[&x], 5).unwrap();
    assert_eq!(functional.parameters(), sequential.parameters());
    let (a, b) = (train(&mut sequential, 20), train(&mut functional, 20));
    assert_eq!(a, b);
    assert_eq!(functional.parameters(), sequential.parameters());
    assert!(a[19] < a[0], "the loss fell: {a:?}");
}

#[test]
fn a_convolution_and_pooling_in_a_graph_run_fused_with_the_sequential_models_results() {
    let sequential = Sequential::new(
        &[8, 8, 1],
        vec![
            Box::new(Conv2D::new(4, (3, 3)).activation(Activation::Relu)),
            Box::new(MaxPooling2D::new((2, 2))),
            Box::new(Flatten),
            Box::new(Dense::new(10)),
        ],
        3,
    )
    .unwrap();
    let inputs = Input::new(&[8, 8, 1]);
    let x = Conv2D::new(4, (3, 3))
        .activation(Activation::Relu)
        .call(&inputs)
        .unwrap();
    let x = MaxPooling2D::new((2, 2)).call(&x).unwrap();
    let x = Flatten.call(&x).unwrap();
    let outputs = Dense::new(10).call(&x).unwrap();
    let functional = Network::new(&[&inputs], &[&outputs], 3).unwrap();
    let images = Tensor::from_vec(
        (0..2 * 64).map(|i| (i % 13) as f32 / 13.0).collect(),
        &[2, 8, 8, 1],
    )
    .unwrap();
    assert_eq!(
        functional.predict(&images).unwrap().to_vec().unwrap(),
        sequential.predict(&images).unwrap().to_vec().unwrap()
    );
}

#[test]
fn a_residual_block_trains_and_its_gradient_reaches_both_branches() {
    let inputs = Input::new(&[20]);
    let h = relu_dense(16).call(&inputs).unwrap();
    let branch = relu_dense(16).call(&h).unwrap();
    let merged = Add.call_on(&[&h, &branch]).unwrap();
    let outputs = Dense::new(10).call(&merged).unwrap();
    let mut model = Network::new(&[&inputs], &[&outputs], 1).unwrap();
    assert!(model.summary().contains("dense[0][0], dense_1[0][0]"));
    let losses = train(&mut model, 40);
    assert!(losses[39] < 0.7 * losses[0], "{losses:?}");
}

#[test]
fn several_inputs_and_outputs_with_concatenate_and_multiply() {
    let a = Input::named(&[6], "a");
    let b = Input::named(&[4], "b");
    let joined = Concatenate.call_on(&[&a, &b]).unwrap();
    assert_eq!(joined.shape(), [10]);
    let left = Dense::new(3).call(&joined).unwrap();
    let right = Dense::new(3).call(&joined).unwrap();
    let product = Multiply.call_on(&[&left, &right]).unwrap();
    let model = Network::new(&[&a, &b], &[&product, &left], 0).unwrap();
    assert_eq!(model.output_shapes(), [&[3][..], &[3]]);
    let (xa, xb) = (batch(5, 6, 1), batch(5, 4, 2));
    let outputs = model.predict_inputs(&[xa.clone(), xb.clone()]).unwrap();
    assert_eq!(outputs.len(), 2);
    let (p, l) = (outputs[0].to_vec().unwrap(), outputs[1].to_vec().unwrap());
    assert_eq!(outputs[0].shape(), [5, 3]);
    // The product's values are the left head's times the right head's.
    let forward = model
        .forward_inputs(&[xa, xb], ForwardContext::default())
        .unwrap();
    assert_eq!(forward.outputs[1].to_vec().unwrap(), l);
    assert!(p.iter().zip(&l).all(|(p, l)| *l == 0.0 || p.is_finite()));
    let err = model.predict(&batch(5, 6, 1)).unwrap_err();
    assert!(matches!(err, NnError::Length { .. }), "{err}");
}

#[test]
fn a_functional_model_rebuilds_from_its_configuration_in_json() {
    let inputs = Input::new(&[12]);
    let h = relu_dense(8).call(&inputs).unwrap();
    let g = relu_dense(8).call(&inputs).unwrap();
    let merged = Concatenate.call_on(&[&h, &g]).unwrap();
    let outputs = Dense::new(3).call(&merged).unwrap();
    let model = Network::new(&[&inputs], &[&outputs], 9).unwrap();
    let json = serde_json::to_string(&model.config()).unwrap();
    let config: ModelConfig = serde_json::from_str(&json).unwrap();
    assert!(matches!(config, ModelConfig::Functional(_)), "{json}");
    let again = Network::from_config(&config, 9).unwrap();
    assert_eq!(again.parameters(), model.parameters());
    assert_eq!(again.summary(), model.summary());
    let x = batch(4, 12, 0);
    assert_eq!(
        again.predict(&x).unwrap().to_vec().unwrap(),
        model.predict(&x).unwrap().to_vec().unwrap()
    );
    // A Sequential model's configuration is its own, and reads back as one.
    let sequential: Network = lockstep_nn::models::mnist_mlp(0).unwrap().into();
    let json = serde_json::to_string(&sequential.config()).unwrap();
    assert!(json.starts_with(r#"{"input_shape":[784]"#), "{json}");
    let config: ModelConfig = serde_json::from_str(&json).unwrap();
    assert!(matches!(config, ModelConfig::Sequential(_)));
    assert_eq!(
        Network::from_config(&config, 0).unwrap().parameters(),
        sequential.parameters()
    );
}

#[test]
fn shapes_are_checked_where_a_layer_is_called() {
    let a = Input::new(&[6]);
    let b = Input::new(&[4]);
    let err = Add.call_on(&[&a, &b]).unwrap_err();
    assert!(err.to_string().contains("[4]"), "{err}");
    let err = Add.call(&a).unwrap_err();
    assert!(err.to_string().contains("two or more"), "{err}");
    let err = Flatten.call_on(&[&a, &b]).unwrap_err();
    assert!(err.to_string().contains("takes one input, not 2"), "{err}");
    let image = Input::new(&[2, 2, 1]);
    let err = Conv2D::new(4, (3, 3)).call(&image).unwrap_err();
    assert!(err.to_string().contains("conv2d"), "{err}");
    let err = Concatenate
        .call_on(&[&Input::new(&[2, 3]), &Input::new(&[3, 3])])
        .unwrap_err();
    assert!(err.to_string().contains("joined last axis"), "{err}");
}

#[test]
fn a_graph_that_cannot_be_a_model_is_an_error_that_says_why() {
    let a = Input::new(&[6]);
    let forgotten = Input::named(&[6], "forgotten");
    let merged = Add.call_on(&[&a, &forgotten]).unwrap();
    let err = Network::new(&[&a], &[&merged], 0).err().unwrap();
    assert!(err.to_string().contains("forgotten"), "{err}");
    let out = Dense::new(2).call(&a).unwrap();
    let err = Network::new(&[&a, &a], &[&out], 0).err().unwrap();
    assert!(err.to_string().contains("listed twice"), "{err}");
    let err = Network::new(&[&out], &[&out], 0).err().unwrap();
    assert!(err.to_string().contains("not an Input"), "{err}");
    Network::new(&[&a], &[&out], 0).unwrap();
    let err = Network::new(&[&a], &[&out], 0).err().unwrap();
    assert!(err.to_string().contains("already built"), "{err}");
    let x = Dense::new(2).named("twin").call(&a).unwrap();
    let y = Dense::new(2).named("twin").call(&x).unwrap();
    let err = Network::new(&[&a], &[&y], 0).err().unwrap();
    assert!(err.to_string().contains("two layers"), "{err}");
}

/// Ids in `input` (read only by an embedding) and in `shared` (read by an embedding and a
/// dense layer): only the first's table is a row lookup.
fn two_tables() -> Network {
    let ids = Input::new(&[3]);
    let shared = Input::new(&[3]);
    let a = Flatten
        .call(&Embedding::new(50, 4).call(&ids).unwrap())
        .unwrap();
    let b = Flatten
        .call(&Embedding::new(50, 4).call(&shared).unwrap())
        .unwrap();
    let c = Dense::new(4).call(&shared).unwrap();
    let joined = Concatenate.call_on(&[&a, &b, &c]).unwrap();
    let out = Dense::new(1).call(&joined).unwrap();
    Network::new(&[&ids, &shared], &[&out], 3).unwrap()
}

#[test]
fn a_pass_on_the_rows_a_batch_names_matches_the_pass_on_the_whole_table() {
    let model = two_tables();
    assert_eq!(
        model.row_lookups(),
        [RowLookup {
            variable: 0,
            input: 0
        }]
    );
    let ids = Tensor::from_vec(vec![4.0, 49.0, 4.0, 7.0, 4.0, 0.0], &[2, 3]).unwrap();
    let shared = Tensor::from_vec(vec![1.0, 2.0, 3.0, 3.0, 2.0, 1.0], &[2, 3]).unwrap();
    let loss = |forward: &lockstep_nn::Forward| ops::sum(&forward.output, &[0, 1], false).unwrap();
    let full = model
        .forward_inputs(&[ids, shared.clone()], ForwardContext::training(0, 0))
        .unwrap();
    let full_grads = loss(&full).backward().unwrap();
    let mut full_out = vec![0.0; model.parameters().len()];
    model.gradients(&full, &full_grads, &mut full_out).unwrap();

    // Rows 0, 4, 7 and 49, renumbered 0..4.
    let used = [0, 4, 7, 49];
    let table = &model.parameters().values()[..50 * 4];
    let compact: Vec<f32> = used
        .iter()
        .flat_map(|&r| table[r * 4..r * 4 + 4].iter().copied())
        .collect();
    let renumbered = Tensor::from_vec(vec![1.0, 3.0, 1.0, 2.0, 1.0, 0.0], &[2, 3]).unwrap();
    let rows = vec![(0, Tensor::from_vec(compact, &[4, 4]).unwrap())];
    let part = model
        .forward_with_rows(&[renumbered, shared], ForwardContext::training(0, 0), rows)
        .unwrap();
    assert_eq!(part.output.to_vec().unwrap(), full.output.to_vec().unwrap());
    let part_grads = loss(&part).backward().unwrap();
    let mut part_out = vec![f32::NAN; model.parameters().len()];
    model.gradients(&part, &part_grads, &mut part_out).unwrap();
    // The table's slot is left as it was; every other variable's gradient is the same.
    assert!(part_out[..200].iter().all(|g| g.is_nan()));
    assert_eq!(part_out[200..], full_out[200..]);
    let table_gradient = part_grads.get(part.variable(0).unwrap()).unwrap();
    let expected: Vec<f32> = used
        .iter()
        .flat_map(|&r| full_out[r * 4..r * 4 + 4].iter().copied())
        .collect();
    assert_eq!(table_gradient.to_vec().unwrap(), expected);
    // Streamed slots would be reduced as they stand: a replaced table's is refused.
    let mut streamed = vec![0.0; model.parameters().len()];
    let e = model
        .gradients_streamed(&part, &loss(&part), &mut streamed, &mut |_, _| {})
        .unwrap_err();
    assert!(e.to_string().contains("cannot stream"), "{e}");

    // Only a row lookup's variable can be replaced, by a table of its width.
    let ids = Tensor::from_vec(vec![0.0; 6], &[2, 3]).unwrap();
    let wide = vec![(0, Tensor::from_vec(vec![0.0; 5], &[1, 5]).unwrap())];
    let Err(e) =
        model.forward_with_rows(&[ids.clone(), ids.clone()], ForwardContext::default(), wide)
    else {
        panic!("a table of another width was taken");
    };
    assert!(e.to_string().contains("[1, 5]"), "{e}");
    let other = vec![(1, Tensor::from_vec(vec![0.0; 4], &[1, 4]).unwrap())];
    let Err(e) = model.forward_with_rows(&[ids.clone(), ids], ForwardContext::default(), other)
    else {
        panic!("a variable that is no row lookup was replaced");
    };
    assert!(e.to_string().contains("not an embedding table"), "{e}");
}
