//! Every optimizer against Keras' update rule written out by hand, its state saved and
//! restored mid-run, its settings through JSON, gradient clipping, and per-step schedules.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::{
    Adagrad, Adam, AdamW, GradientClipping, LearningRateSchedule, Optimizer, OptimizerConfig,
    RmsProp, Sgd, apply_clipped,
};

const GRADS: [[f32; 3]; 3] = [[0.5, -1.0, 2.0], [0.25, 0.0, -3.0], [-1.5, 0.75, 1.0]];

fn run(optimizer: &mut dyn Optimizer, steps: usize) -> Vec<f32> {
    let mut p = vec![1.0_f32, -2.0, 0.5];
    for g in GRADS.iter().cycle().take(steps) {
        optimizer.apply(&mut p, g).unwrap();
    }
    p
}

fn assert_close(got: &[f32], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!(
            (f64::from(*g) - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn rmsprop_adagrad_and_adamw_follow_kerass_update_rules() {
    // Keras 3's rules in f64, three steps.
    let p0 = [1.0_f64, -2.0, 0.5];
    let (lr, rho, eps) = (0.01_f64, 0.9, 1e-7);
    let (mut p, mut v, mut m, mut a) = (p0, [0.0; 3], [0.0; 3], [0.0; 3]);
    for g in GRADS {
        for i in 0..3 {
            let g = f64::from(g[i]);
            v[i] = rho * v[i] + (1.0 - rho) * g * g;
            a[i] = rho * a[i] + (1.0 - rho) * g;
            let increment = lr * g / (v[i] - a[i] * a[i] + eps).sqrt();
            m[i] = 0.5 * m[i] + increment;
            p[i] -= m[i];
        }
    }
    let mut rms = RmsProp::new(0.01).momentum(0.5).centered();
    assert_close(&run(&mut rms, 3), &p);

    let (mut p, mut acc) = (p0, [0.1_f64; 3]);
    for g in GRADS {
        for i in 0..3 {
            let g = f64::from(g[i]);
            acc[i] += g * g;
            p[i] -= 0.01 * g / (acc[i] + eps).sqrt();
        }
    }
    assert_close(&run(&mut Adagrad::new(0.01), 3), &p);

    let (mut p, mut m, mut v) = (p0, [0.0_f64; 3], [0.0_f64; 3]);
    for (t, g) in (1_i32..).zip(GRADS) {
        let alpha = 0.01 * (1.0 - 0.999_f64.powi(t)).sqrt() / (1.0 - 0.9_f64.powi(t));
        for i in 0..3 {
            let g = f64::from(g[i]);
            p[i] -= p[i] * 0.004 * 0.01;
            m[i] += (g - m[i]) * 0.1;
            v[i] += (g * g - v[i]) * (1.0 - 0.999);
            p[i] -= m[i] * alpha / (v[i].sqrt() + eps);
        }
    }
    assert_close(&run(&mut AdamW::new(0.01), 3), &p);
}

fn every_optimizer() -> Vec<Box<dyn Optimizer>> {
    let schedule = LearningRateSchedule::CosineDecay {
        initial_learning_rate: 0.0,
        decay_steps: 10,
        alpha: 0.0,
        warmup_target: Some(0.05),
        warmup_steps: 2,
    };
    vec![
        Box::new(Sgd::with_momentum(0.1, 0.9, true)),
        Box::new(Adam::default().with_schedule(schedule.clone())),
        Box::new(AdamW::default().clipnorm(1.0)),
        Box::new(RmsProp::default().momentum(0.9).centered()),
        Box::new(Adagrad::default().with_schedule(schedule)),
    ]
}

#[test]
fn every_optimizer_restored_mid_run_continues_as_the_original() {
    for mut original in every_optimizer() {
        let mut p = vec![1.0_f32, -2.0, 0.5];
        for g in &GRADS[..2] {
            original.apply(&mut p, g).unwrap();
        }
        // Through JSON, as a checkpoint holds it.
        let json = serde_json::to_string(&original.config()).unwrap();
        let mut restored = serde_json::from_str::<OptimizerConfig>(&json)
            .unwrap()
            .build();
        let saved: Vec<(&str, Vec<f32>)> = original
            .slots()
            .into_iter()
            .map(|(n, s)| (n, s.to_vec()))
            .collect();
        let view: Vec<(&str, &[f32])> = saved.iter().map(|(n, s)| (*n, s.as_slice())).collect();
        restored.restore(original.iterations(), &view).unwrap();
        assert_eq!(restored.learning_rate(), original.learning_rate(), "{json}");
        let mut q = p.clone();
        for _ in 0..3 {
            original.apply(&mut p, &GRADS[2]).unwrap();
            restored.apply(&mut q, &GRADS[2]).unwrap();
        }
        assert_eq!(p, q, "{}", original.name());
    }
}

#[test]
fn a_schedule_sets_the_rate_of_every_step_and_a_set_rate_is_ignored() {
    let schedule = LearningRateSchedule::PiecewiseConstantDecay {
        boundaries: vec![1],
        values: vec![0.5, 0.25],
    };
    let mut sgd = Sgd::new(1.0).with_schedule(schedule);
    let mut p = [0.0_f32];
    let mut rates = Vec::new();
    for _ in 0..3 {
        rates.push(sgd.learning_rate());
        sgd.apply(&mut p, &[1.0]).unwrap();
    }
    assert_eq!(rates, [0.5, 0.5, 0.25]);
    assert_eq!(p, [-1.25]);
    sgd.set_learning_rate(7.0);
    assert_eq!(sgd.learning_rate(), 0.25);
}

#[test]
fn clipping_is_applied_to_the_gradient_before_the_update() {
    let mut sgd = Sgd::new(1.0).global_clipnorm(1.0);
    let mut p = [0.0_f32, 0.0];
    let mut g = [3.0_f32, 4.0];
    let variables = vec![0..1, 1..2];
    apply_clipped(&mut sgd, &mut p, &mut g, &variables).unwrap();
    assert_eq!(p, [-0.6, -0.8]);
    let config = serde_json::to_string(&sgd.config()).unwrap();
    assert!(config.contains("global_clipnorm"), "{config}");
    let rebuilt = serde_json::from_str::<OptimizerConfig>(&config)
        .unwrap()
        .build();
    assert_eq!(
        rebuilt.clipping(),
        GradientClipping {
            global_clipnorm: Some(1.0),
            ..Default::default()
        }
    );
}

#[test]
fn settings_saved_by_earlier_versions_still_load() {
    let old = r#"{"class_name":"Adam","config":{"learning_rate":0.001,"beta_1":0.9,"beta_2":0.999,"epsilon":1e-7}}"#;
    let config: OptimizerConfig = serde_json::from_str(old).unwrap();
    assert_eq!(config, Adam::default().config());
    let rms = serde_json::to_string(&RmsProp::default().config()).unwrap();
    assert!(
        rms.starts_with(r#"{"class_name":"RMSprop","config":{"learning_rate":0.001"#),
        "{rms}"
    );
}
