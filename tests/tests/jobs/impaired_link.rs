//! Two hosts ([`lockstep_e2e::hosts`]: network namespaces joined by a veth pair) whose link
//! delays and drops packets: training waits on retransmissions, not on the cores, so it shares
//! the machine with the other jobs. Needs root (or `CAP_NET_ADMIN`), `ip`, and `tc` or
//! nftables; without them a skip the log shows (`LOCKSTEP_REQUIRE_NETNS=1` makes it a failure).

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_e2e::field;
use lockstep_e2e::hosts::{Hosts, train_keras_epoch};
use lockstep_testenv::{Need, available};

#[test]
fn two_hosts_joined_by_a_slow_lossy_link_still_train_to_completion() {
    let Some(hosts) = available(Need::NetworkNamespaces, Hosts::new(2, true)) else {
        return;
    };
    let (lines, _) = train_keras_epoch(&hosts, None).unwrap();
    assert_eq!(
        field(&lines[0], "weights_checksum"),
        field(&lines[1], "weights_checksum"),
        "{lines:?}"
    );
    let accuracy: f64 = field(&lines[0], "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.8, "{lines:?}");
}
