//! Several hosts on one machine: each worker in its own network namespace with its own IP
//! address, joined by a veth pair, running the same binary a real multi-host run uses. Needs
//! root (or `CAP_NET_ADMIN`) and `ip` from iproute2; without them each test prints why it is
//! skipped and passes.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockstep_e2e::{example_binary, field, task_lines, xtask};

/// Two network namespaces joined by a veth pair, `10.77.<subnet>.1` and `.2`; removed (with
/// their interfaces) on drop.
struct TwoHosts {
    namespaces: [String; 2],
    addresses: [String; 2],
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

impl TwoHosts {
    /// Creates the namespaces; with `impaired`, both ends of the link delay and drop
    /// packets. `Err` says why this machine cannot (no permission, no `ip`, no way to impair).
    fn new(impaired: bool) -> Result<Self, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("ls{}x{n}", std::process::id());
        let namespaces = [format!("{tag}a"), format!("{tag}b")];
        let veths = [format!("{tag}a"), format!("{tag}b")];
        ip(&["netns", "add", &namespaces[0]])?;
        let hosts = Self {
            addresses: [format!("10.77.{n}.1"), format!("10.77.{n}.2")],
            namespaces: namespaces.clone(),
        };
        ip(&["netns", "add", &namespaces[1]])?;
        ip(&[
            "link",
            "add",
            &veths[0],
            "netns",
            &namespaces[0],
            "type",
            "veth",
            "peer",
            "name",
            &veths[1],
            "netns",
            &namespaces[1],
        ])?;
        for side in 0..2 {
            let ns = &namespaces[side];
            let cidr = format!("{}/24", hosts.addresses[side]);
            ip(&["-n", ns, "addr", "add", &cidr, "dev", &veths[side]])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", &veths[side], "up"])?;
            if impaired {
                let how = impair(ns, &veths[side])?;
                println!("{ns}/{}: {how}", veths[side]);
            }
        }
        Ok(hosts)
    }

    /// The `TF_CONFIG` of worker `index`, every worker listening on `port` of its own host.
    fn tf_config(&self, index: usize, port: u16) -> String {
        format!(
            r#"{{"cluster": {{"worker": ["{}:{port}", "{}:{port}"]}}, "task": {{"type": "worker", "index": {index}}}}}"#,
            self.addresses[0], self.addresses[1]
        )
    }

    /// Starts `binary args` as worker `index` inside its namespace.
    fn spawn(&self, index: usize, binary: &std::path::Path, args: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.namespaces[index]])
            .arg(binary)
            .args(args)
            .env("TF_CONFIG", self.tf_config(index, 23_456))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            // Deleting a namespace deletes its end of the veth pair, and so the pair.
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

/// Waits for `child` at most until `deadline`, killing it past that.
fn wait_until(mut child: Child, deadline: Instant) -> Output {
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
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

/// Trains `mnist_keras` for one epoch on the two hosts: each worker's final line.
fn train_on(hosts: &TwoHosts) -> Vec<String> {
    let binary = example_binary("mnist_keras").unwrap();
    let children: Vec<Child> = (0..2)
        .map(|i| hosts.spawn(i, &binary, &KERAS_EPOCH))
        .collect();
    let deadline = Instant::now() + Duration::from_mins(8);
    children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let out = wait_until(child, deadline);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "worker {i}: {}\n{stderr}", out.status);
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .find(|l| l.starts_with("test_accuracy="))
                .unwrap_or_else(|| panic!("worker {i} printed no result\n{stderr}"))
                .to_owned()
        })
        .collect()
}

/// The namespaces, or `None` after printing why this machine cannot make them.
fn two_hosts(impaired: bool) -> Option<TwoHosts> {
    match TwoHosts::new(impaired) {
        Ok(hosts) => Some(hosts),
        Err(why) => {
            println!("skipped: cannot create network namespaces here ({why})");
            None
        }
    }
}

#[test]
fn two_workers_on_two_hosts_train_to_the_weights_of_a_one_host_run() {
    let Some(hosts) = two_hosts(false) else {
        return;
    };
    let lines = train_on(&hosts);
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
    let Some(hosts) = two_hosts(true) else {
        return;
    };
    let lines = train_on(&hosts);
    assert_eq!(
        field(&lines[0], "weights_checksum"),
        field(&lines[1], "weights_checksum"),
        "{lines:?}"
    );
    let accuracy: f64 = field(&lines[0], "test_accuracy").unwrap().parse().unwrap();
    assert!(accuracy > 0.8, "{lines:?}");
}
