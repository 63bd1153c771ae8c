//! Several hosts on one machine: each worker in its own network namespace with its own IP
//! address, two joined by a veth pair, more through a bridge, running the same binary a real
//! multi-host run uses. Making them needs root (or `CAP_NET_ADMIN`) and `ip` from iproute2;
//! impairing their links, `tc` (netem where the kernel has it) or nftables.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::example_binary;

/// Network namespaces, one per host, `10.77.<subnet>.1`, `.2`, …: two joined by a veth pair,
/// more by a veth pair each to a bridge in a namespace of its own (a switch); removed (with
/// their interfaces) on drop.
pub struct Hosts {
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
    /// packets.
    ///
    /// # Errors
    ///
    /// Why this machine cannot (no permission, no `ip`, no way to impair).
    pub fn new(n: usize, impaired: bool) -> Result<Self, String> {
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

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.namespaces.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
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

    /// Starts `binary args` as worker `index` inside its namespace, with `env` set and its
    /// output piped.
    ///
    /// # Errors
    ///
    /// When `ip netns exec` cannot be started.
    pub fn spawn(
        &self,
        index: usize,
        binary: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> std::io::Result<Child> {
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
    finished: mpsc::Receiver<std::io::Result<Output>>,
}

impl Running {
    fn new(child: Child) -> Self {
        let pid = child.id().to_string();
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        Self { pid, finished }
    }

    /// Waits for the child at most until `deadline`, killing it past that.
    fn wait_until(self, deadline: Instant) -> std::io::Result<Output> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.finished.recv_timeout(left).unwrap_or_else(|_| {
            // `ip netns exec` executes the program in its own place: the pid is the program's.
            let _ = Command::new("kill").args(["-KILL", &self.pid]).status();
            self.finished
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("the waiting thread ended")))
        })
    }
}

/// `mnist_keras`'s flags for one epoch, without a backup, one kernel thread a worker.
pub const KERAS_EPOCH: [&str; 7] = [
    "--epochs",
    "1",
    "--no-backup",
    "--threads",
    "1",
    "--rendezvous-timeout-secs",
    "60",
];

/// Trains `mnist_keras` for one epoch, a worker on each host (`slowed` sleeping after each
/// step): each worker's final line, and worker 0's log.
///
/// # Errors
///
/// When the example cannot be built or started, or a worker fails or prints no result (the
/// error holds its stderr).
pub fn train_keras_epoch(
    hosts: &Hosts,
    slowed: Option<usize>,
) -> Result<(Vec<String>, String), String> {
    let binary = example_binary("mnist_keras").map_err(|e| e.to_string())?;
    let n = hosts.len();
    // A sleeping worker hands its core to the others; while it sleeps they must finish their
    // own steps and wait, or the sleep is hidden. With more workers than cores their steps
    // take longer in proportion, so the sleep does too.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let slow_ms = (40 * n.div_ceil(cores)).to_string();
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let env = if slowed == Some(i) {
            vec![("LOCKSTEP_SLOW_STEP_MS", slow_ms.as_str())]
        } else {
            Vec::new()
        };
        let child = hosts
            .spawn(i, &binary, &KERAS_EPOCH, &env)
            .map_err(|e| format!("starting worker {i}: {e}"))?;
        children.push(Running::new(child));
    }
    let deadline = Instant::now() + Duration::from_mins(8);
    let mut chief_log = String::new();
    let mut lines = Vec::with_capacity(n);
    for (i, child) in children.into_iter().enumerate() {
        let out = child
            .wait_until(deadline)
            .map_err(|e| format!("waiting for worker {i}: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(format!("worker {i}: {}\n{stderr}", out.status));
        }
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("test_accuracy="))
            .map(str::to_owned)
            .ok_or_else(|| format!("worker {i} printed no result\n{stderr}"))?;
        if i == 0 {
            chief_log = stderr;
        }
        lines.push(line);
    }
    Ok((lines, chief_log))
}
