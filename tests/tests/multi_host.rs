//! Several hosts on one machine ([`lockstep_e2e::hosts`]): each worker in its own network
//! namespace with its own IP address, two joined by a veth pair, more through a bridge, running
//! the same binary a real multi-host run uses, in an executable of its own: one cluster at a
//! time, so that a straggler shows. Needs root (or `CAP_NET_ADMIN`) and `ip` from iproute2;
//! without them each test is a skip that the log shows (CI sets `LOCKSTEP_REQUIRE_NETNS=1`,
//! which makes it a failure). Hosts joined by a slow, lossy link train in the `jobs`
//! executable (`impaired_link`), beside the other jobs: they wait on the link, not the cores.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::sync::{Mutex, MutexGuard, PoisonError};

use lockstep_e2e::hosts::{Hosts, KERAS_EPOCH, train_keras_epoch};
use lockstep_e2e::{field, task_lines, xtask};
use lockstep_testenv::{Need, available};

/// Holds the machine for one test's clusters: each test's workers share its cores, and a
/// straggler shows only against others that no other test's cluster starves.
fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static MACHINE: Mutex<()> = Mutex::new(());
    MACHINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `n` hosts, or `None` after a skip that says why this machine cannot make them.
#[track_caller]
fn hosts(n: usize) -> Option<Hosts> {
    available(Need::NetworkNamespaces, Hosts::new(n, false))
}

#[test]
fn two_workers_on_two_hosts_train_to_the_weights_of_a_one_host_run() {
    let _machine = one_cluster_at_a_time();
    let Some(hosts) = hosts(2) else {
        return;
    };
    let (lines, _) = train_keras_epoch(&hosts, None).unwrap();
    let checksums: Vec<&str> = lines
        .iter()
        .map(|l| field(l, "weights_checksum").unwrap())
        .collect();
    assert_eq!(checksums[0], checksums[1], "{lines:?}");
    assert_eq!(field(&lines[0], "steps"), Some("63"));

    // The same binary on one host, over loopback and Unix sockets, ends with the same
    // weights: the wire between hosts changes nothing.
    let mut args = vec![
        "run-cluster",
        "--profile",
        "dev",
        "--timeout-secs=600",
        "--",
    ];
    args.extend_from_slice(&KERAS_EPOCH);
    let out = xtask(&args).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local = task_lines(&out.stdout, "worker:0");
    let local = local.last().unwrap();
    assert_eq!(field(local, "weights_checksum"), Some(checksums[0]));
}

#[test]
fn four_and_eight_hosts_behind_a_switch_train_to_one_set_of_weights_and_name_the_slowed_one() {
    let _machine = one_cluster_at_a_time();
    // One kernel thread per worker: on a machine with fewer cores than workers they share the
    // cores (each worker thinks it has a host to itself), which changes their speed, never
    // their weights.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    for n in [4, 8] {
        let Some(hosts) = hosts(n) else {
            return;
        };
        if n > cores {
            println!("{n} workers share {cores} cores: oversubscribed");
        }
        let (lines, chief_log) = train_keras_epoch(&hosts, Some(n - 1)).unwrap();
        let checksums: Vec<&str> = lines
            .iter()
            .map(|l| field(l, "weights_checksum").unwrap())
            .collect();
        assert!(
            checksums.iter().all(|c| *c == checksums[0]),
            "{n} hosts: {lines:?}"
        );
        let report = chief_log
            .lines()
            .find(|line| line.contains("straggler report"))
            .unwrap_or_else(|| panic!("{n} hosts: no straggler report in {chief_log}"));
        println!("{n} hosts: {report}");
        let slowed = format!("worker:{}", n - 1);
        assert_eq!(
            field(report, "waited_for"),
            Some(slowed.as_str()),
            "{n} hosts: {report}"
        );
    }
}
