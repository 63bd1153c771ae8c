//! Which parameter server holds each shard.

use crate::error::{PsError, at_least_one};

/// The `ps` tasks in turn, over the shards of every variable in the order they are created, as
/// TensorFlow's `ParameterServerStrategy` places variables: the first shard of the first
/// variable on `ps:0`, the next shard (of that variable or the next) on `ps:1`, and so on,
/// wrapping round. Every task that builds the model in the same order places it the same way.
///
/// ```
/// let mut ps = lockstep_ps::RoundRobin::new(3)?;
/// assert_eq!(ps.place(2), [0, 1]); // a variable in two shards
/// assert_eq!(ps.place(1), [2]);    // the next, whole
/// assert_eq!(ps.place(2), [0, 1]);
/// # Ok::<(), lockstep_ps::PsError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundRobin {
    num_ps: usize,
    placed: usize,
}

impl RoundRobin {
    /// Placement over `num_ps` parameter servers.
    ///
    /// # Errors
    ///
    /// [`PsError::Setting`] when `num_ps` is 0: a cluster without `ps` tasks has nowhere to
    /// put variables.
    pub fn new(num_ps: usize) -> Result<Self, PsError> {
        Ok(Self {
            num_ps: at_least_one("the number of ps tasks", num_ps)?,
            placed: 0,
        })
    }

    /// The parameter server of each of a variable's `shards`, in shard order.
    pub fn place(&mut self, shards: usize) -> Vec<usize> {
        let first = self.placed;
        self.placed += shards;
        (first..self.placed).map(|i| i % self.num_ps).collect()
    }

    /// The shards placed so far.
    pub fn placed(&self) -> usize {
        self.placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_ps_tasks_is_an_error_naming_the_setting() {
        let err = RoundRobin::new(0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the number of ps tasks must be at least 1, not 0"
        );
    }

    #[test]
    fn every_ps_task_gets_its_share_of_the_shards_within_one() {
        let mut ps = RoundRobin::new(4).unwrap();
        let mut counts = [0_usize; 4];
        for shards in [3, 1, 5, 2, 7] {
            for task in ps.place(shards) {
                counts[task] += 1;
            }
        }
        assert_eq!(ps.placed(), 18);
        assert_eq!(counts, [5, 5, 4, 4]);
    }
}
