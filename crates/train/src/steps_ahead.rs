//! A pass's steps read one step ahead: the input side of `fit`'s and `evaluate`'s loops.

use crate::batch::LabeledBatch;
use crate::error::TrainError;
use crate::replica::{ReplicaBatch, one_per_replica};

/// The next step's batches for `replicas` replicas, as tensors and labels; `None` at the end
/// of the data.
fn next_step<S, B>(
    batches: &mut lockstep_data::Iter<S>,
    replicas: usize,
) -> Result<Option<Vec<ReplicaBatch>>, TrainError>
where
    S: lockstep_data::ElementStream<Item = Vec<B>>,
    B: LabeledBatch,
{
    let Some(step) = batches.next() else {
        return Ok(None);
    };
    let parts = step?
        .into_iter()
        .map(LabeledBatch::into_parts)
        .collect::<Result<_, _>>()?;
    Ok(Some(one_per_replica(parts, replicas, "input")?))
}

/// A pass's steps, each read one step ahead, so that a step's all-reduce carries whether this
/// worker has data for the next (`Objective::more_data`) and the pass ends with its last
/// step, not with a step that no replica of any worker has data for (one more collective,
/// and an update in flight landed first, at the end of every pass).
pub(crate) struct StepsAhead<S> {
    batches: lockstep_data::Iter<S>,
    replicas: usize,
    /// The step read ahead; `None` before the first step is read.
    upcoming: Option<Result<Option<Vec<ReplicaBatch>>, TrainError>>,
}

impl<S, B> StepsAhead<S>
where
    S: lockstep_data::ElementStream<Item = Vec<B>>,
    B: LabeledBatch,
{
    /// Reads nothing yet: a pipeline's own threads (a prefetch's) may fill its buffers
    /// meanwhile.
    pub(crate) fn new(batches: lockstep_data::Iter<S>, replicas: usize) -> Self {
        Self {
            batches,
            replicas,
            upcoming: None,
        }
    }

    /// This step's batches (`None` for a replica without data) and whether this worker has
    /// data for another step. With `read_ahead` false (a step known to be its pass's last,
    /// by `steps_per_epoch`) nothing more is read, and the answer is yes. An input that fails
    /// while read ahead says so at the next call, after this step: the other workers then
    /// learn it as they would have had it failed before that step.
    pub(crate) fn next(
        &mut self,
        read_ahead: bool,
    ) -> Result<(Vec<ReplicaBatch>, bool), TrainError> {
        let replicas = self.replicas;
        let this = match self.upcoming.take() {
            Some(read) => read,
            None => next_step(&mut self.batches, replicas),
        };
        let inputs = this?.unwrap_or_else(|| (0..replicas).map(|_| None).collect());
        if read_ahead {
            self.upcoming = Some(next_step(&mut self.batches, replicas));
        }
        Ok((inputs, !matches!(self.upcoming, Some(Ok(None)))))
    }
}

#[cfg(test)]
mod tests {
    use lockstep_data::{Dataset, from_vec};
    use ndarray::{Array1, Array2};

    use super::*;

    type Batch = (Array2<f32>, Array1<u8>);

    /// A step of one batch of `rows` rows, each labelled `label`; `labels` of them.
    fn step(rows: usize, labels: usize, label: u8) -> Vec<Batch> {
        vec![(Array2::zeros((rows, 2)), Array1::from_elem(labels, label))]
    }

    fn steps_ahead(
        steps: Vec<Vec<Batch>>,
        replicas: usize,
    ) -> StepsAhead<impl lockstep_data::ElementStream<Item = Vec<Batch>>> {
        StepsAhead::new(from_vec(steps).iter().unwrap(), replicas)
    }

    fn labels(inputs: &[ReplicaBatch]) -> Vec<Option<Vec<usize>>> {
        inputs
            .iter()
            .map(|b| {
                b.clone()
                    .map(|parts| parts.targets.into_class_ids().unwrap())
            })
            .collect()
    }

    #[test]
    fn every_step_but_the_last_says_there_is_more_and_then_the_steps_are_empty() {
        let mut ahead = steps_ahead(vec![step(2, 2, 1), step(1, 1, 2)], 2);
        let (first, more) = ahead.next(true).unwrap();
        assert_eq!(labels(&first), [Some(vec![1, 1]), None]);
        assert!(more);
        let (second, more) = ahead.next(true).unwrap();
        assert_eq!(labels(&second), [Some(vec![2]), None]);
        assert!(!more, "the last step must say that no step follows");
        let (after, more) = ahead.next(true).unwrap();
        assert_eq!(labels(&after), [None, None]);
        assert!(!more);
    }

    #[test]
    fn a_step_that_reads_nothing_ahead_says_there_may_be_more() {
        let mut ahead = steps_ahead(vec![step(1, 1, 7)], 1);
        let (first, more) = ahead.next(false).unwrap();
        assert_eq!(labels(&first), [Some(vec![7])]);
        assert!(more);
    }

    #[test]
    fn an_input_that_fails_ahead_says_so_after_the_step_before_it() {
        let mut ahead = steps_ahead(vec![step(1, 1, 3), step(2, 3, 4), step(1, 1, 5)], 1);
        let (first, more) = ahead.next(true).unwrap();
        assert_eq!(labels(&first), [Some(vec![3])]);
        assert!(more, "a step whose next one failed must not end the pass");
        assert!(ahead.next(true).is_err());
    }

    #[test]
    fn a_step_of_more_batches_than_replicas_is_an_error() {
        let two = vec![step(1, 1, 0).remove(0), step(1, 1, 0).remove(0)];
        let mut ahead = steps_ahead(vec![two], 1);
        let err = ahead.next(true).unwrap_err();
        assert!(
            err.to_string().contains("2 batches for 1 replicas"),
            "{err}"
        );
    }
}
