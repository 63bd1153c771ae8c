//! The SLURM resolver's hostlist expansion against SLURM's own: on generated expressions in
//! SLURM's grammar, `expand_hostlist` gives what `scontrol show hostnames` prints. A skip that
//! the log shows where `scontrol` is not installed (CI installs it and sets
//! `LOCKSTEP_REQUIRE_SLURM=1`).

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::process::Command;

use lockstep_cluster::expand_hostlist;
use lockstep_testenv::{Need, skip};
use proptest::prelude::*;

/// One bracket entry: a number or a range, zero-padded to a common width as SLURM writes
/// them (`7`, `01-03`).
fn entry() -> impl Strategy<Value = String> {
    (0_u32..40, 0_u32..4, 1_usize..=3).prop_map(|(lo, span, width)| {
        if span == 0 {
            format!("{lo:0width$}")
        } else {
            format!("{lo:0width$}-{:0width$}", lo + span)
        }
    })
}

/// A host name: letters, then up to two bracket groups (text between them; SLURM takes no
/// text after the last one), or a plain name.
fn bracket() -> impl Strategy<Value = String> {
    prop::collection::vec(entry(), 1..=3).prop_map(|e| format!("[{}]", e.join(",")))
}

fn item() -> impl Strategy<Value = String> {
    (
        "[a-z][a-z0-9-]{0,5}",
        prop::option::of(bracket()),
        prop::option::of(("[a-z]{1,3}", bracket())),
    )
        .prop_map(|(prefix, first, second)| {
            let mut name = prefix;
            if let Some(first) = first {
                name.push_str(&first);
                if let Some((text, second)) = second {
                    name.push_str(&text);
                    name.push_str(&second);
                }
            }
            name
        })
}

fn expression() -> impl Strategy<Value = String> {
    prop::collection::vec(item(), 1..=3).prop_map(|items| items.join(","))
}

/// `scontrol show hostnames EXPRESSION`, one name per line; `None` where SLURM refuses it.
fn slurms_expansion(expression: &str) -> Option<Vec<String>> {
    let out = Command::new("scontrol")
        .args(["show", "hostnames", expression])
        .output()
        .unwrap();
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    })
}

fn scontrol_installed() -> bool {
    Command::new("scontrol")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn hostlists_expand_as_scontrol_expands_them() {
    if !scontrol_installed() {
        skip(
            Need::Slurm,
            "`scontrol` (Debian's slurm-client) is not installed",
        );
        return;
    }
    let compared = std::sync::atomic::AtomicUsize::new(0);
    proptest!(ProptestConfig { cases: 96, ..ProptestConfig::default() }, |(expression in expression())| {
        let slurm = slurms_expansion(&expression);
        prop_assert!(slurm.is_some(), "SLURM refused {expression:?}, which the generator should not make");
        prop_assert_eq!(expand_hostlist(&expression).ok(), slurm, "{}", expression);
        compared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(compared.into_inner(), 96);
}
