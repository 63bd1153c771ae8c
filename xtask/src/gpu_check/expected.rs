//! The GPU machine's tests, by name: each executable and the tests it must run there. The
//! runner fails an executable that passed fewer. Checked against the code three ways, so that
//! a renamed or new GPU test cannot drop out unnoticed: the build fails when a name is missing
//! from its executable, or when a listed executable has a test in scope this list does not
//! name (`--check-names`, which the README's test command runs, does the same on a debug
//! build); and CI fails when a test anywhere skipped for want of a GPU that this list does not
//! name (`--check-skips`, over the test run's skip log).

/// A test executable that runs GPU paths, and the tests the GPU machine runs from it.
pub(crate) struct GpuTests {
    pub(crate) package: &'static str,
    /// `--test` target, or [`LIB`] for the library's unit tests.
    pub(crate) target: &'static str,
    /// What in the executable's tests is the GPU machine's: every test, or those whose names
    /// hold one of some words (the others, CPU-only, are CI's).
    pub(crate) scope: Scope,
    /// The tests it must run, by name: every test in scope.
    pub(crate) tests: &'static [&'static str],
}

/// Which of an executable's tests the GPU machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// All of them.
    Whole,
    /// Those whose names hold one of these words.
    NamesHolding(&'static [&'static str]),
}

/// The `target` of a package's unit tests (its library's test executable).
pub(crate) const LIB: &str = "lib";

/// Every executable the GPU machine runs, in order: the kernels first, the models last.
pub(crate) const GPU_TESTS: &[GpuTests] = &[
    GpuTests {
        package: "lockstep-cuda",
        target: "ops",
        scope: Scope::Whole,
        tests: &[
            "bias_softmax_and_cross_entropy_equal_the_cpus",
            "column_sums_add_the_same_blocks_in_the_same_order_as_the_cpu",
            "dropout_keeps_about_the_rate_deterministically",
            "element_wise_operations_equal_the_cpus",
            "im2col_col2im_and_max_pooling_equal_the_cpus",
            "matmul_equals_the_cpus",
            "opening_a_device_never_panics_and_says_why_it_failed",
            "optimizer_updates_equal_the_cpus",
            "ranges_copy_and_land_on_the_device_as_slices_do_on_the_host",
        ],
    },
    GpuTests {
        package: "lockstep-cuda",
        target: "nccl",
        scope: Scope::Whole,
        tests: &[
            "a_buffer_of_another_device_or_a_range_outside_it_is_refused",
            "a_peer_the_side_channel_sees_gone_ends_the_wait_within_seconds_naming_it",
            "a_rank_that_never_joins_ends_the_join_with_a_timeout_error",
            "a_rank_that_stops_calling_ends_the_others_collective_with_a_timeout_error",
            "a_unique_id_travels_as_its_bytes",
            "an_all_reduce_of_one_rank_equals_the_cpu_rings",
            "an_all_reduce_over_every_local_gpu_equals_the_cpu_rings",
            "nccl_says_its_version_where_it_loads_and_every_call_is_an_error_naming_it_where_not",
        ],
    },
    GpuTests {
        package: "lockstep-tensor",
        target: "gpu",
        scope: Scope::Whole,
        tests: &[
            "a_missing_gpu_is_an_error_naming_the_device_not_a_panic",
            "convolution_pooling_and_dropout_equal_the_cpus",
            "element_wise_operations_equal_the_cpus",
            "products_and_the_loss_equal_the_cpus",
            "sequence_model_operations_equal_the_cpus",
        ],
    },
    GpuTests {
        package: "lockstep-nn",
        target: "training",
        scope: Scope::NamesHolding(&["gpu", "every_device", "nccl"]),
        tests: &[
            "a_session_all_reduced_by_nccl_over_one_gpu_trains_as_one_without",
            "a_session_dropped_unfinished_still_writes_its_steps_back_on_every_device",
            "a_session_on_a_gpu_follows_the_cpu_with_sgd_momentum_and_with_adam",
            "a_session_on_a_gpu_reads_back_nothing_but_the_loss_it_is_asked_for",
            "a_session_predicts_with_its_latest_parameters_on_every_device",
            "a_step_on_a_gpu_gives_the_cpus_loss_and_gradients",
            "moving_a_model_to_a_missing_gpu_hands_it_back_with_the_reason",
            "replicas_on_every_gpu_all_reduced_by_nccl_stay_identical",
            "the_tutorial_cnn_trained_on_a_gpu_reaches_the_cpus_accuracy",
        ],
    },
    GpuTests {
        package: "lockstep-train",
        target: "gpu",
        scope: Scope::Whole,
        tests: &[
            "a_gpu_run_resumed_from_its_backup_ends_bit_identical_to_an_uninterrupted_one",
            "a_gpu_this_process_cannot_use_is_refused_naming_it",
            "a_model_saved_on_a_gpu_loads_onto_a_gpu_and_predicts_the_same",
            "a_replica_on_a_gpu_beside_one_on_the_cpu_trains_as_two_on_the_cpu",
            "error_feedback_with_a_replica_on_a_gpu_resumes_from_its_backup_bit_identical",
            "evaluate_on_a_gpu_gives_the_figures_of_the_weights_it_trained",
            "gradients_summed_by_nccl_train_as_those_summed_over_the_cpu",
            "mirrored_strategy_on_one_gpu_trains_as_one_device_strategy_on_that_gpu",
            "replicas_on_two_gpus_summed_by_nccl_train_as_two_on_the_cpu",
            "two_workers_of_two_gpus_each_summed_within_by_nccl_train_as_four_cpu_replicas",
            "two_workers_on_a_gpu_each_summed_by_one_nccl_group_train_as_two_cpu_replicas",
            "workers_each_summing_its_gpus_with_nccl_and_meeting_over_tcp_train_as_over_the_ring",
        ],
    },
    GpuTests {
        package: "lockstep-train",
        target: LIB,
        scope: Scope::NamesHolding(&["gpu"]),
        tests: &[
            "fit::tests::a_replica_on_a_gpu_and_one_on_the_cpu_end_with_bit_identical_weights",
        ],
    },
    GpuTests {
        package: "lockstep-train",
        target: "estimator",
        scope: Scope::NamesHolding(&["gpu"]),
        tests: &["an_estimator_whose_replica_is_on_a_gpu_trains_and_evaluates_as_on_the_cpu"],
    },
];

impl GpuTests {
    /// The executable's name in the artefact's `tests/`.
    pub(crate) fn file_name(&self) -> String {
        format!("{}-{}", self.package, self.target)
    }

    /// What is wrong with this list beside `listed`, the names the built executable holds
    /// (its `--list`): names it lacks, and tests in scope that the list does not name.
    pub(crate) fn mismatches(&self, listed: &[String]) -> Vec<String> {
        let mut wrong: Vec<String> = self
            .tests
            .iter()
            .filter(|name| !listed.iter().any(|l| l == *name))
            .map(|name| format!("{name} is not a test of {}", self.file_name()))
            .collect();
        let in_scope = |name: &str| match self.scope {
            Scope::Whole => true,
            Scope::NamesHolding(words) => words.iter().any(|w| name.contains(w)),
        };
        wrong.extend(
            listed
                .iter()
                .filter(|name| in_scope(name) && !self.tests.contains(&name.as_str()))
                .map(|name| {
                    format!(
                        "{name} of {} is a GPU test that xtask/src/gpu_check/expected.rs does not name",
                        self.file_name()
                    )
                }),
        );
        wrong
    }
}

/// The tests in `skip_log` (lockstep-testenv's `LOCKSTEP_SKIP_LOG`: file, test, resource, why,
/// tab separated) that skipped for want of a GPU, or of two, and that no entry of
/// [`GPU_TESTS`] names, each as `file test`, once.
pub(crate) fn unnamed_gpu_skips(skip_log: &str) -> Vec<String> {
    let mut unnamed: Vec<String> = skip_log
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            Some((fields.next()?, fields.next()?, fields.next()?))
        })
        .filter(|(_, _, need)| matches!(*need, "a GPU" | "two GPUs"))
        .filter(|(_, test, _)| !GPU_TESTS.iter().any(|t| t.tests.contains(test)))
        .map(|(file, test, _)| format!("{file} {test}"))
        .collect();
    unnamed.sort();
    unnamed.dedup();
    unnamed
}

/// The names in a test executable's `--list --format terse` output.
pub(crate) fn listed_tests(terse: &str) -> Vec<String> {
    terse
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_name_and_an_unnamed_test_in_scope_are_both_mismatches() {
        let tests = GpuTests {
            package: "p",
            target: "t",
            scope: Scope::NamesHolding(&["gpu"]),
            tests: &["runs_on_a_gpu", "renamed_on_a_gpu"],
        };
        let listed = listed_tests(
            "runs_on_a_gpu: test\nnew_on_a_gpu: test\ncpu_only: test\nmod::bench: benchmark\n",
        );
        assert_eq!(listed, ["runs_on_a_gpu", "new_on_a_gpu", "cpu_only"]);
        assert_eq!(
            tests.mismatches(&listed),
            [
                "renamed_on_a_gpu is not a test of p-t",
                "new_on_a_gpu of p-t is a GPU test that xtask/src/gpu_check/expected.rs does not name",
            ]
        );
        let whole = GpuTests {
            scope: Scope::Whole,
            tests: &["runs_on_a_gpu", "new_on_a_gpu", "cpu_only"],
            ..tests
        };
        assert!(whole.mismatches(&listed).is_empty());
    }

    #[test]
    fn a_gpu_skip_of_a_test_no_entry_names_is_reported_once_and_other_skips_are_not() {
        let log = "\
crates/cuda/tests/ops.rs\tmatmul_equals_the_cpus\ta GPU\tno CUDA driver
crates/nn/tests/new.rs\ta_new_gpu_test\ta GPU\tno CUDA driver
crates/nn/tests/new.rs\ta_new_gpu_test\ta GPU\tno CUDA driver
tests/tests/multi_host.rs\ttwo_hosts\tnetwork namespaces\tnot root
garbage
";
        assert_eq!(
            unnamed_gpu_skips(log),
            ["crates/nn/tests/new.rs a_new_gpu_test"]
        );
    }

    #[test]
    fn every_name_is_listed_once() {
        for tests in GPU_TESTS {
            let mut names = tests.tests.to_vec();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), tests.tests.len(), "{}", tests.file_name());
        }
    }
}
