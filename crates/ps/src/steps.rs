//! The steps a coordinator may ask a worker to run: a registry of named functions, the same in
//! every task because every task runs the same program.
//!
//! A Rust program cannot send a closure to another process, so a coordinator sends a step's
//! *name* and its arguments as bytes, and the worker looks the name up in the registry its
//! `main` filled before serving: the shape of `ClusterCoordinator.schedule(fn, args)` with `fn`
//! known to both sides ahead. A worker's state `S` (its model, its connections to the
//! parameter servers, its dataset iterators) is made once when it starts serving and lent to
//! each step.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A step function: the worker's state and the arguments' bytes in, the result's bytes out,
/// or the reason it failed.
pub type StepFn<S> = Arc<dyn Fn(&mut S, &[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// The named steps of a program.
pub struct StepRegistry<S> {
    steps: BTreeMap<String, StepFn<S>>,
}

impl<S> Default for StepRegistry<S> {
    fn default() -> Self {
        Self {
            steps: BTreeMap::new(),
        }
    }
}

impl<S> fmt::Debug for StepRegistry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepRegistry")
            .field("steps", &self.steps.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<S> StepRegistry<S> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `step` under `name` (replacing one of that name).
    #[must_use]
    pub fn with(
        mut self,
        name: impl Into<String>,
        step: impl Fn(&mut S, &[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.steps.insert(name.into(), Arc::new(step));
        self
    }

    /// The step named `name`.
    pub fn get(&self, name: &str) -> Option<&StepFn<S>> {
        self.steps.get(name)
    }

    /// Every registered name, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.steps.keys().map(String::as_str)
    }
}
