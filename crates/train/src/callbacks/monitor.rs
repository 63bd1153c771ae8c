//! Which way a monitored value improves, for `ModelCheckpoint` and `EarlyStopping`.

/// Whether smaller or larger values of the monitored quantity are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Larger for names that hold `acc` (accuracies), smaller otherwise, as Keras decides.
    #[default]
    Auto,
    /// Smaller is better.
    Min,
    /// Larger is better.
    Max,
}

impl Mode {
    /// Whether `value` improves on `best` by more than `min_delta` for the quantity `monitor`.
    pub(crate) fn improves(
        self,
        monitor: &str,
        value: f64,
        best: Option<f64>,
        min_delta: f64,
    ) -> bool {
        let larger = match self {
            Mode::Auto => monitor.contains("acc"),
            Mode::Min => false,
            Mode::Max => true,
        };
        match best {
            None => !value.is_nan(),
            Some(best) if larger => value - min_delta.abs() > best,
            Some(best) => value + min_delta.abs() < best,
        }
    }
}
