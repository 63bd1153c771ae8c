//! How many shards a variable's first axis splits into, as TensorFlow's
//! `tf.distribute.experimental.partitioners` decide, and which rows each shard holds.
//!
//! Two choices differ from TensorFlow, where it fails: a variable whose first axis is empty
//! gets one (empty) shard (TensorFlow's `FixedShardsPartitioner` gives it none, and its
//! `MaxSizePartitioner` divides by zero), and a variable larger than `u128` bytes is an error.
//! Lockstep's variables are `f32`, so the partitioners take the size of an element, not a
//! dtype, and have no `bytes_per_string` setting.

use std::fmt;
use std::ops::Range;

use crate::error::{PsError, at_least_one};

/// Decides how many shards a variable splits into, along its first axis (the only axis
/// `ParameterServerStrategy` partitions).
pub trait Partitioner: fmt::Debug + Send + Sync {
    /// The number of shards for a variable of `shape` whose elements take `element_bytes`
    /// each: at least 1, and no more than the first axis has rows (when it has any).
    ///
    /// # Errors
    ///
    /// [`PsError::Shape`] for a scalar (no axis to split) or a variable too large to count in
    /// bytes; [`PsError::Setting`] when `element_bytes` is 0.
    fn num_shards(&self, shape: &[usize], element_bytes: usize) -> Result<usize, PsError>;
}

/// The rows of the first axis and the bytes of one row of a variable of `shape`.
fn rows_and_row_bytes(shape: &[usize], element_bytes: usize) -> Result<(u128, u128), PsError> {
    at_least_one("element_bytes", element_bytes)?;
    let (&rows, rest) = shape.split_first().ok_or_else(|| PsError::Shape {
        shape: shape.to_vec(),
        why: "a scalar has no first axis to split",
    })?;
    let row_bytes = rest
        .iter()
        .try_fold(element_bytes as u128, |bytes, &d| {
            bytes.checked_mul(d as u128)
        })
        .filter(|bytes| bytes.checked_mul(rows as u128).is_some())
        .ok_or_else(|| PsError::Shape {
            shape: shape.to_vec(),
            why: "its size in bytes does not fit in 128 bits",
        })?;
    Ok((rows as u128, row_bytes))
}

/// `value`, capped at `cap` (as many shards as rows at most), and at least 1.
fn shards_within(value: u128, rows: u128) -> usize {
    let capped = value.min(rows).max(1);
    usize::try_from(capped).unwrap_or(usize::MAX)
}

/// A fixed number of shards, as `tf.distribute.experimental.partitioners.FixedShardsPartitioner`:
/// `num_shards`, or as many as the first axis has rows when it has fewer.
///
/// ```
/// use lockstep_ps::{FixedShardsPartitioner, Partitioner};
///
/// let two = FixedShardsPartitioner::new(2)?;
/// assert_eq!(two.num_shards(&[10, 3], 4)?, 2);
/// assert_eq!(two.num_shards(&[1, 3], 4)?, 1);
/// # Ok::<(), lockstep_ps::PsError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedShardsPartitioner {
    num_shards: usize,
}

impl FixedShardsPartitioner {
    /// Splits every variable into `num_shards`.
    ///
    /// # Errors
    ///
    /// [`PsError::Setting`] when `num_shards` is 0.
    pub fn new(num_shards: usize) -> Result<Self, PsError> {
        Ok(Self {
            num_shards: at_least_one("num_shards", num_shards)?,
        })
    }
}

impl Partitioner for FixedShardsPartitioner {
    fn num_shards(&self, shape: &[usize], element_bytes: usize) -> Result<usize, PsError> {
        let (rows, _) = rows_and_row_bytes(shape, element_bytes)?;
        Ok(shards_within(self.num_shards as u128, rows))
    }
}

/// Shards of at least a size, as `tf.distribute.experimental.partitioners.MinSizePartitioner`:
/// the variable's bytes over `min_shard_bytes`, rounded up, but no more than `max_shards` or
/// the rows of the first axis. (TensorFlow rounds up, so a shard may be a little under
/// `min_shard_bytes`.)
///
/// ```
/// use lockstep_ps::{MinSizePartitioner, Partitioner};
///
/// // 1000 × 100 f32 = 400,000 bytes: two shards of at least 256 KiB would need 512 KiB.
/// let p = MinSizePartitioner::new(256 << 10, 8)?;
/// assert_eq!(p.num_shards(&[1000, 100], 4)?, 2);
/// assert_eq!(MinSizePartitioner::default().num_shards(&[1000, 100], 4)?, 1);
/// # Ok::<(), lockstep_ps::PsError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinSizePartitioner {
    min_shard_bytes: usize,
    max_shards: usize,
}

impl Default for MinSizePartitioner {
    /// TensorFlow's defaults: 256 KiB, one shard.
    fn default() -> Self {
        Self {
            min_shard_bytes: 256 << 10,
            max_shards: 1,
        }
    }
}

impl MinSizePartitioner {
    /// Shards of about `min_shard_bytes` or more, at most `max_shards` of them.
    ///
    /// # Errors
    ///
    /// [`PsError::Setting`] when either is 0.
    pub fn new(min_shard_bytes: usize, max_shards: usize) -> Result<Self, PsError> {
        Ok(Self {
            min_shard_bytes: at_least_one("min_shard_bytes", min_shard_bytes)?,
            max_shards: at_least_one("max_shards", max_shards)?,
        })
    }
}

impl Partitioner for MinSizePartitioner {
    fn num_shards(&self, shape: &[usize], element_bytes: usize) -> Result<usize, PsError> {
        let (rows, row_bytes) = rows_and_row_bytes(shape, element_bytes)?;
        let total = rows * row_bytes;
        let wanted = total.div_ceil(self.min_shard_bytes as u128);
        Ok(shards_within(wanted.min(self.max_shards as u128), rows))
    }
}

/// Shards of at most a size, as `tf.distribute.experimental.partitioners.MaxSizePartitioner`:
/// as many whole rows in a shard as fit in `max_shard_bytes` (at least one, however large a
/// row is), as many shards as that takes, but no more than `max_shards` when it is set (the
/// shards are then larger).
///
/// ```
/// use lockstep_ps::{MaxSizePartitioner, Partitioner};
///
/// // Rows of 400 bytes: 2 fit in 1 KiB, so 10 rows take 5 shards.
/// let p = MaxSizePartitioner::new(1024, None)?;
/// assert_eq!(p.num_shards(&[10, 100], 4)?, 5);
/// assert_eq!(MaxSizePartitioner::new(1024, Some(3))?.num_shards(&[10, 100], 4)?, 3);
/// # Ok::<(), lockstep_ps::PsError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxSizePartitioner {
    max_shard_bytes: usize,
    max_shards: Option<usize>,
}

impl MaxSizePartitioner {
    /// Shards of at most `max_shard_bytes` (unless a row alone is larger), at most
    /// `max_shards` of them when given.
    ///
    /// # Errors
    ///
    /// [`PsError::Setting`] when `max_shard_bytes` or `max_shards` is 0.
    pub fn new(max_shard_bytes: usize, max_shards: Option<usize>) -> Result<Self, PsError> {
        Ok(Self {
            max_shard_bytes: at_least_one("max_shard_bytes", max_shard_bytes)?,
            max_shards: max_shards
                .map(|m| at_least_one("max_shards", m))
                .transpose()?,
        })
    }
}

impl Partitioner for MaxSizePartitioner {
    fn num_shards(&self, shape: &[usize], element_bytes: usize) -> Result<usize, PsError> {
        let (rows, row_bytes) = rows_and_row_bytes(shape, element_bytes)?;
        // A row of no bytes (an axis of 0 after the first) fits any number of times.
        let rows_per_shard = (self.max_shard_bytes as u128)
            .checked_div(row_bytes)
            .map_or(rows, |fit| fit.max(1));
        let mut shards = rows.div_ceil(rows_per_shard.max(1));
        if let Some(max_shards) = self.max_shards {
            shards = shards.min(max_shards as u128);
        }
        Ok(shards_within(shards, rows))
    }
}

/// The rows of each of `shards` shards of a first axis of `rows` rows, in order: the first
/// `rows % shards` shards hold one row more than the others, as TensorFlow's sharded
/// variables do. No shards for `shards == 0`.
///
/// ```
/// assert_eq!(lockstep_ps::shard_rows(10, 3), [0..4, 4..7, 7..10]);
/// ```
pub fn shard_rows(rows: usize, shards: usize) -> Vec<Range<usize>> {
    let Some(base) = rows.checked_div(shards) else {
        return Vec::new();
    };
    let longer = rows % shards;
    let mut start = 0;
    (0..shards)
        .map(|i| {
            let len = base + usize::from(i < longer);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn settings_of_zero_are_refused_naming_them() {
        let zero = FixedShardsPartitioner::new(0).unwrap_err();
        assert_eq!(zero.to_string(), "num_shards must be at least 1, not 0");
        assert!(MinSizePartitioner::new(0, 1).is_err());
        assert!(MinSizePartitioner::new(1, 0).is_err());
        assert!(MaxSizePartitioner::new(0, None).is_err());
        assert!(MaxSizePartitioner::new(1, Some(0)).is_err());
    }

    #[test]
    fn scalars_zero_byte_elements_and_unaddressable_sizes_are_errors() {
        let p = FixedShardsPartitioner::new(2).unwrap();
        assert!(matches!(p.num_shards(&[], 4), Err(PsError::Shape { .. })));
        assert!(matches!(
            p.num_shards(&[4], 0),
            Err(PsError::Setting { .. })
        ));
        let huge = [usize::MAX, usize::MAX, usize::MAX];
        let err = MinSizePartitioner::default()
            .num_shards(&huge, 4)
            .unwrap_err();
        assert!(err.to_string().contains("128 bits"), "{err}");
    }

    #[test]
    fn an_empty_first_axis_gets_one_empty_shard() {
        let partitioners: [&dyn Partitioner; 3] = [
            &FixedShardsPartitioner::new(3).unwrap(),
            &MinSizePartitioner::new(1, 3).unwrap(),
            &MaxSizePartitioner::new(1, None).unwrap(),
        ];
        for p in partitioners {
            assert_eq!(p.num_shards(&[0, 5], 4).unwrap(), 1, "{p:?}");
        }
        assert_eq!(shard_rows(0, 1), vec![Range { start: 0, end: 0 }]);
    }

    #[test]
    fn tensorflows_documented_examples_give_its_answers() {
        // The examples of `tf.distribute.experimental.partitioners`, on f32 variables.
        let fixed = FixedShardsPartitioner::new(2).unwrap();
        assert_eq!(fixed.num_shards(&[10, 3], 4).unwrap(), 2);
        let min = MinSizePartitioner::new(4, 2).unwrap();
        assert_eq!(min.num_shards(&[6, 1], 4).unwrap(), 2);
        let max = MaxSizePartitioner::new(4, None).unwrap();
        assert_eq!(max.num_shards(&[6, 1], 4).unwrap(), 6);
        let capped = MaxSizePartitioner::new(4, Some(2)).unwrap();
        assert_eq!(capped.num_shards(&[6, 1], 4).unwrap(), 2);
        let large = MaxSizePartitioner::new(1024, None).unwrap();
        assert_eq!(large.num_shards(&[6, 1], 4).unwrap(), 1);
    }

    fn shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0_usize..5000, 1..4)
    }

    proptest! {
        #[test]
        fn shards_are_at_least_one_and_no_more_than_the_rows(
            shape in shape(),
            n in 1_usize..64,
            bytes in 1_usize..1 << 24,
            element in 1_usize..9,
        ) {
            let partitioners: [Box<dyn Partitioner>; 4] = [
                Box::new(FixedShardsPartitioner::new(n).unwrap()),
                Box::new(MinSizePartitioner::new(bytes, n).unwrap()),
                Box::new(MaxSizePartitioner::new(bytes, None).unwrap()),
                Box::new(MaxSizePartitioner::new(bytes, Some(n)).unwrap()),
            ];
            for p in &partitioners {
                let shards = p.num_shards(&shape, element).unwrap();
                prop_assert!(shards >= 1, "{p:?}");
                prop_assert!(shards <= shape[0].max(1), "{p:?}: {shards}");
            }
        }

        #[test]
        fn max_size_shards_hold_at_most_their_bytes_unless_a_row_is_larger(
            shape in shape(),
            bytes in 1_usize..1 << 20,
        ) {
            let p = MaxSizePartitioner::new(bytes, None).unwrap();
            let shards = p.num_shards(&shape, 4).unwrap();
            let row_bytes: usize = shape[1..].iter().product::<usize>() * 4;
            let longest = shard_rows(shape[0], shards).iter().map(ExactSizeIterator::len).max();
            if row_bytes <= bytes && shape[0] > 0 {
                prop_assert!(longest.unwrap_or(0) * row_bytes <= bytes);
                // And no fewer shards would do.
                let fewer = shards - 1;
                if fewer > 0 {
                    let longest = shard_rows(shape[0], fewer).iter().map(ExactSizeIterator::len).max();
                    prop_assert!(longest.unwrap_or(0) * row_bytes > bytes);
                }
            }
        }

        #[test]
        fn min_size_shards_are_the_bytes_over_the_minimum_rounded_up_within_the_caps(
            shape in shape(),
            bytes in 1_usize..1 << 20,
            max_shards in 1_usize..64,
        ) {
            let p = MinSizePartitioner::new(bytes, max_shards).unwrap();
            let total: usize = shape.iter().product::<usize>() * 4;
            let expected = total.div_ceil(bytes).min(max_shards).min(shape[0]).max(1);
            prop_assert_eq!(p.num_shards(&shape, 4).unwrap(), expected);
        }

        #[test]
        fn shard_rows_cover_the_axis_in_order_with_lengths_one_apart(
            rows in 0_usize..100_000,
            shards in 1_usize..200,
        ) {
            let ranges = shard_rows(rows, shards);
            prop_assert_eq!(ranges.len(), shards);
            prop_assert_eq!(ranges[0].start, 0);
            prop_assert_eq!(ranges[shards - 1].end, rows);
            for pair in ranges.windows(2) {
                prop_assert_eq!(pair[0].end, pair[1].start);
                prop_assert!(pair[0].len() >= pair[1].len());
                prop_assert!(pair[0].len() - pair[1].len() <= 1);
            }
        }
    }
}
