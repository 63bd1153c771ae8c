//! Property tests: valid specs round-trip through JSON unchanged, and no input — arbitrary
//! text, arbitrary JSON, mangled configs, odd environment values — makes a parser panic.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::collections::HashSet;

use lockstep_cluster::{
    Address, CHIEF, Cluster, ClusterResolver, ClusterSpec, EVALUATOR, PS, SlurmResolver, TaskId,
    TfConfig, TfConfigResolver, WORKER, expand_hostlist,
};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|o| format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3])),
        any::<[u16; 8]>().prop_map(|s| format!("[{}]", std::net::Ipv6Addr::from(s))),
        "[a-z][a-z0-9-]{0,10}[a-z0-9](\\.[a-z][a-z0-9]{0,5}){0,2}",
        Just("localhost".to_owned()),
    ]
}

/// Job name → task count, always with someone to train.
fn job_counts() -> impl Strategy<Value = Vec<(String, usize)>> {
    let custom = prop::option::of((
        "[a-z][a-z0-9_]{0,8}".prop_filter("not a known job", |n| {
            ![CHIEF, WORKER, PS, EVALUATOR].contains(&n.as_str())
        }),
        1..=3_usize,
    ));
    (0..=1_usize, 0..=6_usize, 0..=3_usize, 0..=1_usize, custom)
        .prop_filter("someone must train", |(chief, workers, ..)| {
            chief + workers > 0
        })
        .prop_map(|(chief, workers, ps, evaluator, custom)| {
            [
                (CHIEF, chief),
                (WORKER, workers),
                (PS, ps),
                (EVALUATOR, evaluator),
            ]
            .into_iter()
            .map(|(job, n)| (job.to_owned(), n))
            .chain(custom)
            .filter(|(_, n)| *n > 0)
            .collect()
        })
}

prop_compose! {
    fn valid_config()(counts in job_counts())(
        hosts in prop::collection::vec(host(), counts.iter().map(|(_, n)| n).sum::<usize>()),
        ports in prop::collection::hash_set(1..=u16::MAX, counts.iter().map(|(_, n)| n).sum::<usize>()),
        task in any::<Index>(),
        rpc_layer in prop::option::of("[a-z]{1,6}"),
        environment in prop::option::of(any::<String>()),
        counts in Just(counts),
    ) -> TfConfig {
        let mut addresses = hosts.into_iter().zip(ports).map(|(h, p)| format!("{h}:{p}"));
        let jobs: Vec<(String, Vec<String>)> = counts
            .iter()
            .map(|(job, n)| (job.clone(), addresses.by_ref().take(*n).collect()))
            .collect();
        let cluster = ClusterSpec::from_jobs(jobs).expect("generated specs are valid");
        let tasks: Vec<TaskId> = cluster.tasks().map(|(t, _)| t).collect();
        TfConfig { task: Some(task.get(&tasks).clone()), cluster, rpc_layer, environment }
    }
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("cluster".to_owned()),
        Just("task".to_owned()),
        Just("type".to_owned()),
        Just("index".to_owned()),
        Just("worker".to_owned()),
        Just("chief".to_owned()),
        Just("evaluator".to_owned()),
        Just("rpc_layer".to_owned()),
        ".{0,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (0..4_u64).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        "(localhost|\\[::1\\]|10\\.0\\.0\\.[0-9]):[0-9]{1,5}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_valid_config_round_trips_through_json_unchanged(config in valid_config()) {
        let json = config.to_json();
        prop_assert_eq!(TfConfig::parse(&json), Ok(config.clone()));
        prop_assert!(Cluster::new(config).is_ok());
    }

    #[test]
    fn ranks_follow_chief_then_workers(config in valid_config()) {
        let chiefs = config.cluster.num_tasks(CHIEF);
        let workers = config.cluster.num_tasks(WORKER);
        let cluster = Cluster::new(config).unwrap();
        prop_assert_eq!(cluster.world_size(), chiefs + workers);
        let expected = match cluster.task().job.as_str() {
            CHIEF => Some(0),
            WORKER => Some(chiefs + cluster.task().index),
            _ => None,
        };
        prop_assert_eq!(cluster.rank(), expected);
        prop_assert_eq!(cluster.is_chief(), expected == Some(0));
        let addresses: HashSet<_> = cluster.group_addresses().into_iter().collect();
        prop_assert_eq!(addresses.len(), cluster.world_size());
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = TfConfig::parse(&text);
        let _ = TfConfigResolver::from_json(text.clone()).resolve();
        let _ = text.parse::<Address>();
        let _ = text.parse::<TaskId>();
        let _ = expand_hostlist(&text);
    }

    #[test]
    fn arbitrary_json_never_panics(value in arbitrary_json()) {
        let _ = TfConfigResolver::from_json(value.to_string()).resolve();
        let wrapped = serde_json::json!({"cluster": value.clone(), "task": {"type": "worker", "index": 0}});
        let _ = TfConfigResolver::from_json(wrapped.to_string()).resolve();
        let as_task = serde_json::json!({"cluster": {"worker": ["a:1"]}, "task": value});
        let _ = TfConfigResolver::from_json(as_task.to_string()).resolve();
    }

    #[test]
    fn mangled_configs_never_panic(config in valid_config(), cut in any::<Index>(), len in 0..8_usize, junk in ".{0,4}") {
        let json = config.to_json();
        let start = cut.index(json.len());
        let end = (start + len).min(json.len());
        if json.is_char_boundary(start) && json.is_char_boundary(end) {
            let mangled = format!("{}{junk}{}", &json[..start], &json[end..]);
            let _ = TfConfigResolver::from_json(mangled).resolve();
        }
    }

    #[test]
    fn parsed_addresses_print_in_a_form_that_parses_back_equal(text in "(\\[[0-9a-f:.]{0,20}\\]|[a-zA-Z0-9.-]{0,20}):[0-9]{0,6}") {
        if let Ok(address) = text.parse::<Address>() {
            prop_assert_eq!(address.to_string().parse::<Address>(), Ok(address));
        }
    }

    #[test]
    fn hostlists_expand_to_the_product_of_their_ranges(
        prefix in "[a-z]{1,4}", lo in 0..50_u32, span in 0..20_u32, suffix in "[a-z]{0,3}", extra in 0..3_u32,
    ) {
        let hi = lo + span;
        let expression = format!("{prefix}[{lo}-{hi}]{suffix}[0-{extra}],single");
        let hosts = expand_hostlist(&expression).unwrap();
        prop_assert_eq!(hosts.len() as u32, (span + 1) * (extra + 1) + 1);
        prop_assert_eq!(hosts.last().map(String::as_str), Some("single"));
        let first = format!("{prefix}{lo}{suffix}0");
        prop_assert_eq!(hosts.first(), Some(&first));
    }

    #[test]
    fn hostlist_like_noise_never_panics(text in "[a-z0-9\\[\\],-]{0,40}") {
        let _ = expand_hostlist(&text);
    }

    #[test]
    fn slurm_variables_never_panic(
        procid in "[0-9x-]{0,4}", ntasks in "[0-9]{0,4}", nodes in "[a-z0-9\\[\\],-]{0,20}",
        per_node in prop::option::of("[0-9(x),]{0,12}"), base_port in any::<u16>(),
    ) {
        let mut vars = vec![("SLURM_PROCID", procid), ("SLURM_NTASKS", ntasks), ("SLURM_STEP_NODELIST", nodes)];
        if let Some(p) = per_node {
            vars.push(("SLURM_STEP_TASKS_PER_NODE", p));
        }
        let _ = SlurmResolver::from_vars(vars).with_base_port(base_port).resolve();
    }

    #[test]
    fn a_valid_slurm_step_ranks_every_task(nodes in 1..5_usize, per_node in 1..4_usize, pick in any::<Index>()) {
        let ntasks = nodes * per_node;
        let procid = pick.index(ntasks);
        let cluster = SlurmResolver::from_vars([
            ("SLURM_PROCID", procid.to_string()),
            ("SLURM_NTASKS", ntasks.to_string()),
            ("SLURM_STEP_NODELIST", format!("n[1-{nodes}]")),
        ]).resolve().unwrap();
        prop_assert_eq!(cluster.rank(), Some(procid));
        prop_assert_eq!(cluster.world_size(), ntasks);
        let expected = format!("n{}:{}", procid / per_node + 1, 8888 + procid % per_node);
        prop_assert_eq!(cluster.peer_address(procid), Some(expected.as_str()));
    }
}
