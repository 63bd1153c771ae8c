//! Fashion-MNIST, as Debian's `dataset-fashion-mnist` installs it, loads as MNIST does: the
//! full 60,000 training and 10,000 test images, ten balanced classes. A skip that the log
//! shows where the package is not installed (CI installs it and sets
//! `LOCKSTEP_REQUIRE_FASHION_MNIST=1`).

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::path::Path;

use lockstep_data::mnist::{FASHION_MNIST_DIR, Mnist};
use lockstep_testenv::{Need, skip};

#[test]
fn fashion_mnist_loads_whole_with_ten_balanced_classes() {
    if !Path::new(FASHION_MNIST_DIR).is_dir() {
        skip(
            Need::FashionMnist,
            format_args!("{FASHION_MNIST_DIR} missing (apt-get install dataset-fashion-mnist)"),
        );
        return;
    }
    let fashion = Mnist::fashion().unwrap();
    assert_eq!(fashion.train.images.shape(), [60_000, 28, 28, 1]);
    assert_eq!(fashion.test.images.shape(), [10_000, 28, 28, 1]);
    let mut counts = [0_usize; 10];
    for &label in &fashion.test.labels {
        counts[usize::from(label)] += 1;
    }
    assert_eq!(counts, [1000; 10]);
    // Not the digits: the first training image of Fashion-MNIST is an ankle boot (class 9).
    assert_eq!(fashion.train.labels[0], 9);
}
