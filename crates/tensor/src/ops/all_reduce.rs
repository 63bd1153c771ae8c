//! A sum across the replicas that train in sync, inside a forward pass: what a synchronised
//! batch normalization needs for statistics over the global batch.

use std::sync::Arc;

use super::gpu::{On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// Sums buffers element-wise across every replica in sync, each replica calling with its own
/// buffer of the same length, as `tf.distribute.ReplicaContext.all_reduce(SUM, …)`. Every
/// replica must make the same calls in the same order. The training crates implement it over
/// their collectives; this crate only calls it.
pub trait AllReduceSum: Send + Sync {
    /// Replaces `values` with their sum over every replica.
    ///
    /// # Errors
    ///
    /// Why the collective failed (a peer that died, a timeout), as text.
    fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), String>;
}

/// `x` summed element-wise over every replica in sync (through `replicas`). Differentiable:
/// the gradient of each replica's `x` is the sum of every replica's gradient of the result,
/// itself an all-reduce, so every replica's backward pass must reach this operation too.
/// Runs on the CPU.
///
/// ```
/// use std::sync::Arc;
/// use lockstep_tensor::{Tensor, ops};
///
/// /// Two replicas whose other one holds the same values as this one.
/// struct Twice;
/// impl ops::AllReduceSum for Twice {
///     fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), String> {
///         values.iter_mut().for_each(|v| *v *= 2.0);
///         Ok(())
///     }
/// }
///
/// let replicas: Arc<dyn ops::AllReduceSum> = Arc::new(Twice);
/// let x = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// assert_eq!(ops::all_reduce_sum(&x, &replicas)?.to_vec()?, [2.0, 4.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// The collective's failure, or a tensor on a GPU.
pub fn all_reduce_sum(x: &Tensor, replicas: &Arc<dyn AllReduceSum>) -> Result<Tensor, TensorError> {
    const OP: &str = "all_reduce_sum";
    if let On::Cuda(_) = on(OP, &[x])? {
        return Err(TensorError::device(OP, x.device(), "runs on the CPU only"));
    }
    let mut data = x.host().to_vec();
    replicas
        .all_reduce_sum(&mut data)
        .map_err(|why| TensorError::Collective { op: OP, why })?;
    let replicas = Arc::clone(replicas);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(data, shape.clone(), &[x], move |g, _| {
        let mut d = g.host().to_vec();
        replicas
            .all_reduce_sum(&mut d)
            .map_err(|why| TensorError::Collective { op: OP, why })?;
        Ok(vec![Some(Tensor::raw(d, shape.clone()))])
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ops;

    /// Replicas whose others hold `others` times this one's values, counting the calls.
    struct Scaled {
        others: f32,
        calls: Mutex<usize>,
    }

    impl AllReduceSum for Scaled {
        fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), String> {
            *self.calls.lock().map_err(|e| e.to_string())? += 1;
            for v in values.iter_mut() {
                *v *= 1.0 + self.others;
            }
            Ok(())
        }
    }

    struct Broken;

    impl AllReduceSum for Broken {
        fn all_reduce_sum(&self, _: &mut [f32]) -> Result<(), String> {
            Err("peer 3 closed its connection".into())
        }
    }

    #[test]
    fn the_backward_pass_all_reduces_the_gradient_once() {
        let scaled = Arc::new(Scaled {
            others: 2.0,
            calls: Mutex::new(0),
        });
        let replicas: Arc<dyn AllReduceSum> = scaled.clone();
        let x = Tensor::parameter(vec![1.0, -1.0], &[2]).unwrap();
        let summed = all_reduce_sum(&x, &replicas).unwrap();
        assert_eq!(summed.to_vec().unwrap(), [3.0, -3.0]);
        let loss = ops::sum(&ops::mul(&summed, &summed).unwrap(), &[0], false).unwrap();
        let grads = loss.backward().unwrap();
        // d(Σ s²)/ds = 2s = [6, -6], summed over three replicas holding the same.
        assert_eq!(grads.get(&x).unwrap().to_vec().unwrap(), [18.0, -18.0]);
        assert_eq!(*scaled.calls.lock().unwrap(), 2);
    }

    #[test]
    fn a_failed_collective_is_an_error_naming_its_cause() {
        let replicas: Arc<dyn AllReduceSum> = Arc::new(Broken);
        let x = Tensor::from_vec(vec![1.0], &[1]).unwrap();
        let error = all_reduce_sum(&x, &replicas).unwrap_err().to_string();
        assert!(error.contains("peer 3 closed"), "{error}");
    }
}
