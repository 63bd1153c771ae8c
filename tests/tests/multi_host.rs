//! Several hosts on one machine: each worker in its own network namespace with its own IP
//! address, two joined by a veth pair, more through a bridge, running the same binary a real
//! multi-host run uses. Needs root (or `CAP_NET_ADMIN`) and `ip` from iproute2; without them
//! each test is a skip that the log shows (CI sets `LOCKSTEP_REQUIRE_NETNS=1`, which makes it
//! a failure).

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lockstep_e2e::{example_binary, field, task_lines, xtask};
use lockstep_testenv::{Need, available};

/// Network namespaces, one per host, `10.77.<subnet>.1`, `.2`, …: two joined by a veth pair,
/// more by a veth pair each to a bridge in a namespace of its own (a switch); removed (with
/// their interfaces) on drop.
struct Hosts {
    namespaces: Vec<String>,
    addresses: Vec<String>,
    /// The switch's namespace, with more than two hosts.
    switch: Option<String>,
}

/// Runs `ip` with `args`; the error is its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// Creates `n` hosts; with `impaired`, every host's end of its link delays and drops
    /// packets. `Err` says why this machine cannot (no permission, no `ip`, no way to impair).
    fn new(n: usize, impaired: bool) -> Result<Self, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let subnet = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("ls{}x{subnet}", std::process::id());
        let mut hosts = Self {
            namespaces: Vec::new(),
            addresses: (1..=n).map(|i| format!("10.77.{subnet}.{i}")).collect(),
            switch: None,
        };
        // Each namespace joins `hosts` as soon as it exists, so a failure part-way removes it.
        for i in 0..n {
            let ns = format!("{tag}h{i}");
            ip(&["netns", "add", &ns])?;
            hosts.namespaces.push(ns);
        }
        let veths: Vec<String> = (0..n).map(|i| format!("{tag}v{i}")).collect();
        if n == 2 {
            let ns = &hosts.namespaces;
            ip(&[
                "link", "add", &veths[0], "netns", &ns[0], "type", "veth", "peer", "name",
                &veths[1], "netns", &ns[1],
            ])?;
        } else {
            let switch = format!("{tag}sw");
            ip(&["netns", "add", &switch])?;
            hosts.switch = Some(switch.clone());
            ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &switch, "link", "set", "br0", "up"])?;
            for (i, veth) in veths.iter().enumerate() {
                let port = format!("{tag}p{i}");
                ip(&[
                    "link",
                    "add",
                    veth,
                    "netns",
                    &hosts.namespaces[i],
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &port,
                    "netns",
                    &switch,
                ])?;
                ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
                ip(&["-n", &switch, "link", "set", &port, "up"])?;
            }
        }
        for (i, veth) in veths.iter().enumerate() {
            let ns = &hosts.namespaces[i];
            let cidr = format!("{}/24", hosts.addresses[i]);
            ip(&["-n", ns, "addr", "add", &cidr, "dev", veth])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", veth, "up"])?;
            if impaired {
                let how = impair(ns, veth)?;
                println!("{ns}/{veth}: {how}");
            }
        }
        Ok(hosts)
    }

    /// The `TF_CONFIG` of worker `index`, every worker listening on `port` of its own host.
    fn tf_config(&self, index: usize, port: u16) -> String {
        let workers: Vec<String> = self
            .addresses
            .iter()
            .map(|a| format!("\"{a}:{port}\""))
            .collect();
        format!(
            r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {index}}}}}"#,
            workers.join(", ")
        )
    }

    /// Starts `binary args` as worker `index` inside its namespace, with `env` set.
    fn spawn(
        &self,
        index: usize,
        binary: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.namespaces[index]])
            .arg(binary)
            .args(args)
            .env("TF_CONFIG", self.tf_config(index, 23_456))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its ends of the veth pairs, and so the pairs.
        for ns in self.namespaces.iter().chain(&self.switch) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Makes `dev` in namespace `ns` delay and drop packets: with `tc netem` (5 ms ± 1 ms, 1 %
/// loss) where the kernel has it, else with a 50 Mbit/s token bucket (queueing delay) and
/// 1 % random drops by nftables. Returns what it applied.
fn impair(ns: &str, dev: &str) -> Result<&'static str, String> {
    let netem = ip(&[
        "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "5ms",
        "1ms", "loss", "1%",
    ]);
    let Err(no_netem) = netem else {
        return Ok("tc netem delay 5ms 1ms loss 1%");
    };
    ip(&[
        "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "50mbit",
        "burst", "32kbit", "latency", "50ms",
    ])
    .map_err(|e| format!("{no_netem}; {e}"))?;
    for rule in [
        "add table inet impair",
        "add chain inet impair in { type filter hook input priority 0 ; }",
        "add rule inet impair in meta l4proto tcp numgen random mod 100 lt 1 drop",
    ] {
        let mut args = vec!["netns", "exec", ns, "nft"];
        args.extend(rule.split(' '));
        ip(&args).map_err(|e| format!("{no_netem}; {e}"))?;
    }
    Ok("no netem in this kernel: tc tbf rate 50mbit + nftables drops 1% of TCP packets")
}

/// A child whose output is being read on a thread of its own, so that a child that writes
/// much never blocks on a full pipe (and, being one worker of a cluster, stalls the others).
struct Running {
    pid: String,
    finished: std::sync::mpsc::Receiver<std::io::Result<Output>>,
}

impl Running {
    fn new(child: Child) -> Self {
        let pid = child.id().to_string();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        Self { pid, finished }
    }

    /// Waits for the child at most until `deadline`, killing it past that.
    fn wait_until(self, deadline: Instant) -> Output {
        let left = deadline.saturating_duration_since(Instant::now());
        let output = self.finished.recv_timeout(left).unwrap_or_else(|_| {
            // `ip netns exec` executes the program in its own place: the pid is the program's.
            let _ = Command::new("kill").args(["-KILL", &self.pid]).status();
            self.finished.recv().unwrap()
        });
        output.unwrap()
    }
}

const KERAS_EPOCH: [&str; 7] = [
    "--epochs",
    "1",
    "--no-backup",
    "--threads",
    "1",
    "--rendezvous-timeout-secs",
    "60",
];

/// Holds the machine for one test's clusters: each test's workers share its cores, and a
/// straggler shows only against others that no other test's cluster starves.
fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static MACHINE: Mutex<()> = Mutex::new(());
    MACHINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Trains `mnist_keras` for one epoch, a worker on each host (`slowed` sleeping after each
/// step): each worker's final line, and worker 0's log.
fn train_on(hosts: &Hosts, slowed: Option<usize>) -> (Vec<String>, String) {
    let binary = example_binary("mnist_keras").unwrap();
    let n = hosts.namespaces.len();
    // A sleeping worker hands its core to the others; while it sleeps they must finish their
    // own steps and wait, or the sleep is hidden. With more workers than cores their steps
    // take longer in proportion, so the sleep does too.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let slow_ms = (40 * n.div_ceil(cores)).to_string();
    let children: Vec<Running> = (0..n)
        .map(|i| {
            let env = if slowed == Some(i) {
                vec![("LOCKSTEP_SLOW_STEP_MS", slow_ms.as_str())]
            } else {
                Vec::new()
            };
            Running::new(hosts.spawn(i, &binary, &KERAS_EPOCH, &env))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_mins(8);
    let mut chief_log = String::new();
    let lines = children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let out = child.wait_until(deadline);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "worker {i}: {}\n{stderr}", out.status);
            if i == 0 {
                chief_log = stderr.clone().into_owned();
            }
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .find(|l| l.starts_with("test_accuracy="))
                .unwrap_or_else(|| panic!("worker {i} printed no result\n{stderr}"))
                .to_owned()
        })
        .collect();
    (lines, chief_log)
}

/// `n` hosts, or `None` after a skip that says why this machine cannot make them.
#[track_caller]
fn hosts(n: usize, impaired: bool) -> Option<Hosts> {
    available(Need::NetworkNamespaces, Hosts::new(n, impaired))
}

#[test]
fn two_workers_on_two_hosts_train_to_the_weights_of_a_one_host_run() {
    let _machine = one_cluster_at_a_time();
    let Some(hosts) = hosts(2, false) else {
        return;
    };
    let (lines, _) = train_on(&hosts, None);
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
fn two_hosts_joined_by_a_slow_lossy_link_still_train_to_completion() {
    let _machine = one_cluster_at_a_time();
    let Some(hosts) = hosts(2, true) else {
        return;
    };
    let (lines, _) = train_on(&hosts, None);
    assert_eq!(
        field(&lines[0], "weights_checksum"),
        field(&lines[1], "weights_checksum"),
        "{lines:?}"
    );
    let accuracy: f64 = field(&lines[0], "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.8, "{lines:?}");
}

#[test]
fn four_and_eight_hosts_behind_a_switch_train_to_one_set_of_weights_and_name_the_slowed_one() {
    let _machine = one_cluster_at_a_time();
    // One kernel thread per worker: on a machine with fewer cores than workers they share the
    // cores (each worker thinks it has a host to itself), which changes their speed, never
    // their weights.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    for n in [4, 8] {
        let Some(hosts) = hosts(n, false) else {
            return;
        };
        if n > cores {
            println!("{n} workers share {cores} cores: oversubscribed");
        }
        let (lines, chief_log) = train_on(&hosts, Some(n - 1));
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
