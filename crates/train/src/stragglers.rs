//! The straggler report: at each epoch's end `fit` gathers, from every replica, how long its
//! steps took and how long it was blocked in their collectives, and the chief logs the
//! replica the others waited for (the one blocked least), how long they waited for it per
//! step, and what share of their step that was. Timing is two clock reads per step; the
//! gathering one small all-reduce per epoch.

use std::time::Duration;

use lockstep_collective::ReduceOp;

use crate::error::TrainError;
use crate::model::Model;
use crate::replica::on_every_replica;

/// One replica's steps since the last report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Waits {
    steps: u64,
    /// The steps' whole time, from the start of the forward pass to the update's end, and
    /// the waits to land an update in flight outside a step ([`Waits::add_wait`]).
    step: Duration,
    /// The part of it spent waiting in the step's collectives.
    blocked: Duration,
}

impl Waits {
    pub(crate) fn add_step(&mut self, step: Duration, blocked: Duration) {
        self.steps += 1;
        self.step += step;
        self.blocked += blocked;
    }

    /// A wait outside any step for the last step's collectives (an update left in flight,
    /// landed at an epoch's end): time of the steps, all of it blocked, and no step more.
    pub(crate) fn add_wait(&mut self, blocked: Duration) {
        self.step += blocked;
        self.blocked += blocked;
    }

    /// The steps' whole time and the part blocked in their collectives.
    pub(crate) fn times(&self) -> (Duration, Duration) {
        (self.step, self.blocked)
    }
}

/// Values per replica in the gathered report: its task's kind and index, its steps, their
/// time and the time blocked in them (seconds).
const FIELDS: usize = 5;

/// Whom the others waited for in one epoch's collectives: the replica blocked least per step
/// (the one that arrived last), as the chief's straggler report names it
/// ([`TrainingContext::straggler`](crate::TrainingContext::straggler)).
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    /// The task (and replica, when a task has several) the others waited for: `worker:2`.
    pub label: String,
    /// That replica's index among all replicas in sync.
    pub replica: usize,
    /// How long the others were blocked per step beyond it, on average.
    pub wait_per_step: Duration,
    /// That wait's share of the others' step time.
    pub share: f64,
}

/// Gathers every replica's [`Waits`] since the last report (every replica of every process
/// must call it at the same point) and, on the chief, logs whom the others waited for and
/// returns it (`None` elsewhere, with one replica, or without steps).
pub(crate) fn report(model: &mut Model, epoch: u64) -> Result<Option<Straggler>, TrainError> {
    let world = model.num_replicas_in_sync();
    let (kind, index) = task_code(model.task());
    let local = model.replicas.len();
    let inputs = vec![(); local];
    let gathered = on_every_replica(&mut model.replicas, inputs, |r, ()| {
        let mut values = vec![0.0_f64; world * FIELDS];
        let at = r.link.replica_id() * FIELDS;
        let waits = std::mem::take(&mut r.waits);
        values[at..at + FIELDS].copy_from_slice(&[
            kind,
            index,
            waits.steps as f64,
            waits.step.as_secs_f64(),
            waits.blocked.as_secs_f64(),
        ]);
        r.link.all_reduce(&mut values, ReduceOp::Sum)?;
        Ok(values)
    })?;
    if !model.is_chief() {
        return Ok(None);
    }
    let found = gathered.first().and_then(|values| straggler(values, local));
    if let Some(s) = &found {
        tracing::info!(
            epoch = epoch + 1,
            waited_for = %s.label,
            wait_ms_per_step = %format!("{:.1}", s.wait_per_step.as_secs_f64() * 1e3),
            share_of_step = %format!("{:.2}", s.share),
            "straggler report: the replica the others waited for in this epoch's collectives"
        );
    }
    Ok(found)
}

/// Whom the others waited for, from every replica's gathered values (`local` replicas per
/// process): the replica blocked least per step. `None` without steps or with one replica.
pub(crate) fn straggler(values: &[f64], local: usize) -> Option<Straggler> {
    let replicas: Vec<&[f64]> = values.chunks_exact(FIELDS).collect();
    if replicas.len() < 2 || replicas.iter().any(|r| r[2] < 1.0) {
        return None;
    }
    let blocked = |r: &[f64]| r[4] / r[2];
    let (slowest, least) = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| (i, blocked(r)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let others: Vec<&&[f64]> = replicas
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != slowest)
        .map(|(_, r)| r)
        .collect();
    let count = others.len() as f64;
    let wait = others.iter().map(|r| blocked(r) - least).sum::<f64>() / count;
    let step = others.iter().map(|r| r[3] / r[2]).sum::<f64>() / count;
    let r = replicas[slowest];
    let mut label = task_name(r[0], r[1]);
    if local > 1 {
        label = format!("{label} replica {}", slowest % local);
    }
    Some(Straggler {
        label,
        replica: slowest,
        wait_per_step: Duration::from_secs_f64(wait.max(0.0)),
        share: if step > 0.0 { wait / step } else { 0.0 },
    })
}

/// A task as two numbers: its kind (chief 0, worker 1, anything else 2) and index.
fn task_code(task: &str) -> (f64, f64) {
    let (kind, index) = task.split_once(':').unwrap_or((task, "0"));
    let kind = match kind {
        "chief" => 0.0,
        "worker" => 1.0,
        _ => 2.0,
    };
    (kind, index.parse::<u32>().map_or(0.0, f64::from))
}

/// The inverse of [`task_code`] (`local` for a task outside a cluster).
fn task_name(kind: f64, index: f64) -> String {
    let kind = match kind as u32 {
        0 => "chief",
        1 => "worker",
        _ => return "local".to_owned(),
    };
    format!("{kind}:{}", index as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_blocked_least_is_the_one_the_others_waited_for() {
        // Three workers, 10 steps each of 100 ms; worker:2 was blocked 5 ms a step, the
        // others 45 and 35: they waited 40 and 30 ms for it, 35 on average, 35% of a step.
        let values = [
            1.0, 0.0, 10.0, 1.0, 0.45, //
            1.0, 1.0, 10.0, 1.0, 0.35, //
            1.0, 2.0, 10.0, 1.0, 0.05,
        ];
        let s = straggler(&values, 1).unwrap();
        assert_eq!(s.label, "worker:2");
        assert_eq!(s.replica, 2);
        assert!((s.wait_per_step.as_secs_f64() - 0.035).abs() < 1e-9);
        assert!((s.share - 0.35).abs() < 1e-9);
        assert_eq!(straggler(&values[..FIELDS], 1), None, "one replica");
        let mut two_local = values;
        two_local[0] = 0.0;
        let s = straggler(&two_local, 3).unwrap();
        assert_eq!(s.label, "worker:2 replica 2");
    }

    #[test]
    fn a_wait_after_the_last_step_counts_as_its_time_blocked_but_not_as_a_step() {
        let mut waits = Waits::default();
        waits.add_step(Duration::from_millis(8), Duration::from_millis(1));
        waits.add_wait(Duration::from_millis(5));
        assert_eq!(waits.steps, 1);
        assert_eq!(
            waits.times(),
            (Duration::from_millis(13), Duration::from_millis(6))
        );
    }

    #[test]
    fn task_names_survive_their_codes() {
        for task in ["chief:0", "worker:0", "worker:17"] {
            let (kind, index) = task_code(task);
            assert_eq!(task_name(kind, index), task);
        }
        assert_eq!(task_name(task_code("local").0, 0.0), "local");
    }
}
