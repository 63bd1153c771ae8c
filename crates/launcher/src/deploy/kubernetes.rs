//! The Kubernetes manifests: a JobSet, a Kubeflow Trainer v2 `TrainJob` with its
//! `TrainingRuntime`, and a legacy Kubeflow `TFJob`, each beside the volume claim that holds
//! the chief's state.
//!
//! The manifests are built as JSON values and written as YAML, so they are well-formed by
//! construction; the tests read them back and check what each controller and the resolver
//! need.

use anyhow::Context as _;
use serde_json::{Value, json};

use super::container::{self, BIN_DIR, NONROOT_ID};
use super::{Artefact, JobArgs, STATE_DIR_VARIABLE, Workload, check_host_name, header};

/// Options of `lockstep deploy k8s`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct KubernetesArgs {
    #[command(flatten)]
    pub(super) job: JobArgs,
    /// Worker pods, one task each (the TFJob's chief is one of them).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The image holding the example binaries, built with the Containerfile written beside
    /// the manifests.
    #[arg(long, default_value_t = format!("lockstep-examples:{}", env!("CARGO_PKG_VERSION")))]
    image: String,
    /// CPU cores each pod requests (and the threads of its kernels).
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// Memory each pod requests, in Kubernetes' notation.
    #[arg(long, default_value = "1Gi")]
    memory: String,
    /// Size of the shared volume the chief keeps its backup and checkpoints on.
    #[arg(long, default_value = "1Gi")]
    storage: String,
    /// Storage class of the shared volume; it must offer `ReadWriteMany` (NFS, CephFS, EFS,
    /// Filestore, Azure Files...). Default: the cluster's default class.
    #[arg(long)]
    storage_class: Option<String>,
}

/// Where the shared volume is mounted in every pod.
const STATE_DIR: &str = "/var/lib/lockstep";
/// The name of the volume in the pod specs.
const STATE_VOLUME: &str = "state";
/// The JobSet's replicated job of workers.
const JOBSET_REPLICATED_JOB: &str = "workers";
/// The replicated job and container name Kubeflow Trainer v2 overrides with the TrainJob's
/// `trainer` settings (with the ancestor label below).
const TRAINER_NODE: &str = "node";
/// The container name and port name the TFJob operator looks for.
const TFJOB_CONTAINER: &str = "tensorflow";
const TFJOB_PORT_NAME: &str = "tfjob-port";
/// The port when `--port` is not given: TensorFlow's, and the Kubernetes resolver's default.
const DEFAULT_PORT: u16 = 8888;

/// The pod annotations JobSet sets, which the manifests pass to the resolver as variables.
const JOBSET_ANNOTATIONS: [(&str, &str); 3] = [
    ("JOBSET_NAME", "jobset.sigs.k8s.io/jobset-name"),
    (
        "REPLICATED_JOB_NAME",
        "jobset.sigs.k8s.io/replicatedjob-name",
    ),
    ("JOB_INDEX", "jobset.sigs.k8s.io/job-index"),
];

/// The manifests and the Containerfile.
pub(crate) fn files(args: &KubernetesArgs) -> anyhow::Result<Vec<Artefact>> {
    let manifests = Manifests::new(args)?;
    let yaml = |what: &str, docs: &[Value]| -> anyhow::Result<String> {
        Ok(format!(
            "{}{}",
            header("k8s", what),
            serde_saphyr::to_string_multiple(docs)?
        ))
    };
    let mut files = vec![
        Artefact {
            name: "jobset.yaml",
            private: false,
            text: yaml(
                "A JobSet: the workers as one indexed Job, all recreated when one fails.",
                &manifests.jobset(),
            )?,
        },
        Artefact {
            name: "trainjob.yaml",
            private: false,
            text: yaml(
                "A Kubeflow Trainer v2 TrainJob and the TrainingRuntime it refers to.",
                &manifests.trainjob(),
            )?,
        },
        Artefact {
            name: "tfjob.yaml",
            private: false,
            text: yaml(
                "A Kubeflow TFJob (training-operator v1): a chief, workers and an evaluator.",
                &manifests.tfjob(),
            )?,
        },
    ];
    files.push(Artefact {
        name: SECRET_FILE,
        private: true,
        text: yaml(
            "The cluster secret every pod's tasks prove to each other (docs/SECURITY.md): fresh for this deployment; apply it before the job, and keep this file to yourself.",
            &[manifests.cluster_secret()?],
        )?,
    });
    files.extend(container::files(args.job.workload()));
    Ok(files)
}

/// The file of the `Secret` every manifest's pods read the cluster secret from.
pub(crate) const SECRET_FILE: &str = "cluster-secret.yaml";

/// The key of the cluster secret in its `Secret`.
const SECRET_KEY: &str = "secret";

/// The settings every manifest is built from, checked.
struct Manifests<'a> {
    args: &'a KubernetesArgs,
    name: &'a str,
    /// The binary every container runs.
    binary: &'a str,
    port: u16,
}

impl<'a> Manifests<'a> {
    fn new(args: &'a KubernetesArgs) -> anyhow::Result<Self> {
        let name = args.job.checked_name()?;
        if args.workers == 0 {
            anyhow::bail!("--workers 0: a job needs at least one worker");
        }
        if args.cpus == 0 {
            anyhow::bail!("--cpus 0: a pod needs at least one core");
        }
        let last = args.workers - 1;
        check_host_name(
            &format!("{name}-{JOBSET_REPLICATED_JOB}-0-{last}"),
            "JobSet pod",
        )?;
        check_host_name(&format!("{name}-{TRAINER_NODE}-0-{last}"), "TrainJob pod")?;
        // The TFJob operator names each pod's service `<name>-<role>-<index>`.
        for host in [
            format!("{name}-chief-0"),
            format!("{name}-worker-{}", last.saturating_sub(1)),
            format!("{name}-evaluator-0"),
        ] {
            check_host_name(&host, "TFJob service")?;
        }
        Ok(Self {
            args,
            name,
            binary: args.job.binary()?,
            port: args.job.port.unwrap_or(DEFAULT_PORT),
        })
    }

    fn claim_name(&self) -> String {
        format!("{}-state", self.name)
    }

    fn labels(&self) -> Value {
        json!({
            "app.kubernetes.io/name": "lockstep",
            "app.kubernetes.io/instance": self.name,
        })
    }

    /// The `ReadWriteMany` claim every pod mounts: the chief writes its backup there, a
    /// restarted chief (on any node) and the evaluator read it.
    fn volume_claim(&self) -> Value {
        let mut spec = json!({
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": self.args.storage}},
        });
        if let Some(class) = &self.args.storage_class {
            spec["storageClassName"] = json!(class);
        }
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": self.claim_name(), "labels": self.labels()},
            "spec": spec,
        })
    }

    fn command(&self) -> Vec<String> {
        vec![format!("{BIN_DIR}/{}", self.binary)]
    }

    fn task_args(&self, with_evaluator: bool) -> Vec<String> {
        self.args
            .job
            .task_args(STATE_DIR, with_evaluator, self.args.cpus)
    }

    fn resources(&self) -> Value {
        let amounts = json!({"cpu": self.args.cpus.to_string(), "memory": self.args.memory});
        json!({"requests": amounts, "limits": amounts})
    }

    /// The name of the `Secret` that holds the cluster secret.
    fn secret_name(&self) -> String {
        format!("{}-cluster-secret", self.name)
    }

    /// The `Secret` holding a fresh cluster secret, which every container reads into
    /// `LOCKSTEP_CLUSTER_SECRET`.
    fn cluster_secret(&self) -> anyhow::Result<Value> {
        let secret = lockstep_cluster::generate_secret_hex()
            .context("making the deployment's cluster secret")?;
        Ok(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.secret_name(), "labels": self.labels()},
            "type": "Opaque",
            "stringData": {SECRET_KEY: secret},
        }))
    }

    /// A container running the example, listening on the job's port, with the cluster secret
    /// from its `Secret` (an environment variable: a mounted file would be readable by the
    /// pod's `fsGroup`, which the secret file's check refuses).
    fn container(&self, name: &str, port_name: &str, env: &[Value], with_evaluator: bool) -> Value {
        let mut env = env.to_vec();
        env.push(json!({
            "name": lockstep_cluster::SECRET_VARIABLE,
            "valueFrom": {"secretKeyRef": {"name": self.secret_name(), "key": SECRET_KEY}},
        }));
        if matches!(self.args.job.workload(), Workload::Program(..)) {
            // A program of the user's finds the shared volume here (an example is given flags).
            env.push(json!({"name": STATE_DIR_VARIABLE, "value": STATE_DIR}));
        }
        json!({
            "name": name,
            "image": self.args.image,
            "command": self.command(),
            "args": self.task_args(with_evaluator),
            "env": env,
            "ports": [{"name": port_name, "containerPort": self.port}],
            "resources": self.resources(),
            "volumeMounts": [{"name": STATE_VOLUME, "mountPath": STATE_DIR}],
        })
    }

    /// A pod spec around `container`. `restart_policy`: `None` where the controller sets it.
    fn pod_spec(&self, container: &Value, restart_policy: Option<&str>) -> Value {
        let mut spec = json!({
            "containers": [container],
            // The image runs as distroless' non-root user; the group lets it write the volume.
            "securityContext": {"fsGroup": NONROOT_ID},
            "volumes": [{
                "name": STATE_VOLUME,
                "persistentVolumeClaim": {"claimName": self.claim_name()},
            }],
        });
        if let Some(policy) = restart_policy {
            spec["restartPolicy"] = json!(policy);
        }
        spec
    }

    /// The variables the Kubernetes resolver reads that come from JobSet's annotations, plus
    /// the fixed ones.
    fn jobset_env(&self) -> Vec<Value> {
        let mut env: Vec<Value> = JOBSET_ANNOTATIONS
            .iter()
            .map(|(var, annotation)| {
                json!({
                    "name": var,
                    "valueFrom": {"fieldRef": {
                        "fieldPath": format!("metadata.annotations['{annotation}']"),
                    }},
                })
            })
            .collect();
        env.extend([
            literal("LOCKSTEP_JOBS", "1"),
            literal("LOCKSTEP_PORT", &self.port.to_string()),
            literal("RUST_LOG", "info"),
        ]);
        env
    }

    /// The JobSet failure policy: recreate every Job when one fails (JobSet's default
    /// action), at most `--max-restarts` times.
    fn failure_policy(&self) -> Value {
        json!({"maxRestarts": self.args.job.max_restarts})
    }

    fn jobset(&self) -> Vec<Value> {
        let workers = self.args.workers;
        let mut env = self.jobset_env();
        env.extend([
            literal("LOCKSTEP_PODS_PER_JOB", &workers.to_string()),
            literal("LOCKSTEP_SUBDOMAIN", self.name),
        ]);
        let container = self.container("lockstep", "lockstep", &env, false);
        let pod = json!({
            "metadata": {"labels": self.labels()},
            "spec": self.pod_spec(&container, Some("Never")),
        });
        let jobset = json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": {
                "failurePolicy": self.failure_policy(),
                "network": {
                    "enableDNSHostnames": true,
                    "publishNotReadyAddresses": true,
                    "subdomain": self.name,
                },
                "replicatedJobs": [{
                    "name": JOBSET_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {"spec": indexed_job(&pod, Some(workers))},
                }],
            },
        });
        vec![self.volume_claim(), jobset]
    }

    fn runtime_name(&self) -> String {
        format!("{}-runtime", self.name)
    }

    fn trainjob(&self) -> Vec<Value> {
        let workers = self.args.workers;
        // The runtime holds what does not change from run to run; the TrainJob overrides the
        // image, command, arguments and node count of the container named `node`.
        let container = self.container(TRAINER_NODE, "lockstep", &self.jobset_env(), false);
        let pod = json!({
            "metadata": {"labels": self.labels()},
            "spec": self.pod_spec(&container, Some("Never")),
        });
        let runtime = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainingRuntime",
            "metadata": {
                "name": self.runtime_name(),
                "labels": {"trainer.kubeflow.org/framework": "lockstep"},
            },
            "spec": {
                "mlPolicy": {"numNodes": workers},
                "template": {"spec": {
                    "failurePolicy": self.failure_policy(),
                    "network": {"enableDNSHostnames": true, "publishNotReadyAddresses": true},
                    "replicatedJobs": [{
                        "name": TRAINER_NODE,
                        "replicas": 1,
                        "template": {
                            "metadata": {"labels": {
                                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
                            }},
                            "spec": indexed_job(&pod, None),
                        },
                    }],
                }},
            },
        });
        let trainjob = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "TrainingRuntime",
                    "name": self.runtime_name(),
                },
                "trainer": {
                    "image": self.args.image,
                    "command": self.command(),
                    "args": self.task_args(false),
                    "numNodes": workers,
                    "env": [literal("LOCKSTEP_PODS_PER_JOB", &workers.to_string())],
                    "resourcesPerNode": self.resources(),
                },
            },
        });
        vec![self.volume_claim(), runtime, trainjob]
    }

    fn tfjob(&self) -> Vec<Value> {
        let replica = |replicas: usize| {
            // Every task gets the checkpoint flags: the chief writes for the evaluator, which
            // reads them. The operator writes each pod's TF_CONFIG.
            let container = self.container(
                TFJOB_CONTAINER,
                TFJOB_PORT_NAME,
                &[literal("RUST_LOG", "info")],
                true,
            );
            json!({
                "replicas": replicas,
                // A failed task restarts in place; the others stop at once on the broken
                // connection and restart too, and the chief resumes from its backup.
                "restartPolicy": "OnFailure",
                "template": {
                    "metadata": {"labels": self.labels()},
                    "spec": self.pod_spec(&container, None),
                },
            })
        };
        let mut replicas = serde_json::Map::new();
        replicas.insert("Chief".into(), replica(1));
        if self.args.workers > 1 {
            replicas.insert("Worker".into(), replica(self.args.workers - 1));
        }
        replicas.insert("Evaluator".into(), replica(1));
        let tfjob = json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": {
                "runPolicy": {
                    "backoffLimit": self.args.job.max_restarts,
                    // The job succeeds with its chief; the evaluator still has the last
                    // checkpoint to evaluate, so running pods are left to finish.
                    "cleanPodPolicy": "None",
                },
                "tfReplicaSpecs": replicas,
            },
        });
        vec![self.volume_claim(), tfjob]
    }
}

/// The workers' Job: indexed, every pod one task; a failed pod fails the Job at once
/// (`backoffLimit: 0`) so that JobSet restarts all of them. `pods`: `None` where the
/// controller sets the count.
fn indexed_job(pod_template: &Value, pods: Option<usize>) -> Value {
    let mut spec = json!({
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": pod_template,
    });
    if let Some(pods) = pods {
        spec["parallelism"] = json!(pods);
        spec["completions"] = json!(pods);
    }
    spec
}

/// An environment variable with a fixed value.
fn literal(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use lockstep_cluster::{ClusterResolver, KubernetesResolver, TfConfigResolver};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        k8s: KubernetesArgs,
    }

    fn args(flags: &[&str]) -> KubernetesArgs {
        Cli::parse_from(std::iter::once("k8s").chain(flags.iter().copied())).k8s
    }

    /// The documents of `file` as written and read back by a YAML parser.
    fn documents(flags: &[&str], file: &str) -> Vec<Value> {
        let files = files(&args(flags)).unwrap();
        let text = &files.iter().find(|f| f.name == file).unwrap().text;
        serde_saphyr::from_multiple(text).unwrap()
    }

    fn kind<'v>(docs: &'v [Value], kind: &str) -> &'v Value {
        docs.iter().find(|d| d["kind"] == kind).unwrap()
    }

    #[test]
    fn a_users_program_is_the_command_of_every_container_and_of_the_image() {
        let flags = [
            "--image",
            "registry.example/mine:1",
            "--",
            "my_trainer",
            "--epochs",
            "3",
        ];
        let docs = documents(&flags, "tfjob.yaml");
        let tfjob = kind(&docs, "TFJob");
        let chief = &tfjob["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0];
        assert_eq!(chief["command"], json!([format!("{BIN_DIR}/my_trainer")]));
        assert_eq!(chief["args"], json!(["--epochs", "3"]));
        assert!(
            chief["env"]
                .as_array()
                .unwrap()
                .contains(&json!({"name": STATE_DIR_VARIABLE, "value": STATE_DIR})),
            "{chief}"
        );
        let files = files(&args(&flags)).unwrap();
        let containerfile = &files
            .iter()
            .find(|f| f.name == "Containerfile")
            .unwrap()
            .text;
        assert!(
            containerfile.contains("--bin my_trainer"),
            "{containerfile}"
        );
    }

    /// The value of each variable of `container` as the kubelet would set it in a pod whose
    /// annotations are `annotations`.
    fn environment(container: &Value, annotations: &[(&str, String)]) -> Vec<(String, String)> {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|var| {
                let name = var["name"].as_str().unwrap().to_owned();
                if let Some(secret) = var["valueFrom"]["secretKeyRef"].as_object() {
                    return (name, format!("the secret {}", secret["name"]));
                }
                let value = var["value"].as_str().map_or_else(
                    || {
                        let path = var["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
                        annotations
                            .iter()
                            .find(|(a, _)| path == format!("metadata.annotations['{a}']"))
                            .unwrap_or_else(|| panic!("{path} is not set on the pod"))
                            .1
                            .clone()
                    },
                    str::to_owned,
                );
                (name, value)
            })
            .collect()
    }

    /// Every container of every pod template in `value`, however deep.
    fn containers(value: &Value) -> Vec<&Value> {
        match value {
            Value::Object(map) => map
                .iter()
                .flat_map(|(key, v)| match (key.as_str(), v) {
                    ("containers", Value::Array(list)) => list.iter().collect(),
                    _ => containers(v),
                })
                .collect(),
            Value::Array(list) => list.iter().flat_map(containers).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn every_container_reads_the_cluster_secret_from_the_secret_written_beside_it() {
        let secret_doc = &documents(&[], SECRET_FILE)[0];
        assert_eq!(secret_doc["kind"], "Secret");
        let name = secret_doc["metadata"]["name"].as_str().unwrap();
        let value = secret_doc["stringData"][SECRET_KEY].as_str().unwrap();
        assert_eq!(value.len(), 64);
        assert!(value.bytes().all(|b| b.is_ascii_hexdigit()));
        // Fresh for every deployment.
        let again = &documents(&[], SECRET_FILE)[0];
        assert_ne!(again["stringData"][SECRET_KEY].as_str().unwrap(), value);
        let mut checked = 0;
        for file in ["jobset.yaml", "trainjob.yaml", "tfjob.yaml"] {
            for doc in documents(&[], file) {
                for container in containers(&doc) {
                    let var = container["env"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|v| v["name"] == lockstep_cluster::SECRET_VARIABLE)
                        .unwrap_or_else(|| panic!("{file}: {container}"));
                    assert_eq!(var["valueFrom"]["secretKeyRef"]["name"], name);
                    assert_eq!(var["valueFrom"]["secretKeyRef"]["key"], SECRET_KEY);
                    checked += 1;
                }
            }
        }
        // The JobSet's pod, the runtime's pod, and the TFJob's chief, workers and evaluator.
        assert_eq!(checked, 5);
        let secret_file = files(&args(&[])).unwrap();
        assert!(
            secret_file
                .iter()
                .any(|f| f.name == SECRET_FILE && f.private)
        );
    }

    /// Checks the volume claim and that every pod of `pod_specs` mounts it where the state
    /// flags point.
    fn check_state_volume(docs: &[Value], pod_specs: &[&Value], name: &str) {
        let claim = kind(docs, "PersistentVolumeClaim");
        assert_eq!(claim["apiVersion"], "v1");
        assert_eq!(claim["metadata"]["name"], format!("{name}-state"));
        assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
        for spec in pod_specs {
            assert_eq!(
                spec["volumes"][0]["persistentVolumeClaim"]["claimName"],
                claim["metadata"]["name"]
            );
            let container = &spec["containers"][0];
            assert_eq!(
                container["volumeMounts"][0]["name"],
                spec["volumes"][0]["name"]
            );
            assert_eq!(container["volumeMounts"][0]["mountPath"], STATE_DIR);
            let args: Vec<&str> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let backup = args.iter().position(|&a| a == "--backup-dir").unwrap();
            assert!(args[backup + 1].starts_with(STATE_DIR), "{args:?}");
            assert_eq!(spec["securityContext"]["fsGroup"], NONROOT_ID);
        }
    }

    #[test]
    fn the_jobset_recreates_every_pod_on_failure_and_the_resolver_finds_its_pods() {
        let docs = documents(&["--workers", "3", "--max-restarts", "5"], "jobset.yaml");
        let jobset = kind(&docs, "JobSet");
        assert_eq!(jobset["apiVersion"], "jobset.x-k8s.io/v1alpha2");
        assert_eq!(jobset["metadata"]["name"], "lockstep-mnist");
        let spec = &jobset["spec"];
        assert_eq!(spec["failurePolicy"], json!({"maxRestarts": 5}));
        assert_eq!(spec["network"]["enableDNSHostnames"], true);
        assert_eq!(spec["network"]["subdomain"], "lockstep-mnist");
        let replicated = &spec["replicatedJobs"][0];
        assert_eq!(replicated["replicas"], 1);
        let job = &replicated["template"]["spec"];
        assert_eq!(job["completionMode"], "Indexed");
        assert_eq!(
            (&job["parallelism"], &job["completions"]),
            (&json!(3), &json!(3))
        );
        assert_eq!(job["backoffLimit"], 0);
        let pod = &job["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never");
        check_state_volume(&docs, &[pod], "lockstep-mnist");
        let container = &pod["containers"][0];
        assert_eq!(container["command"], json!(["/usr/local/bin/mnist_keras"]));
        assert_eq!(container["ports"][0]["containerPort"], 8888);

        // What each pod's resolver makes of the variables JobSet and the Job controller give
        // it: the pods' own DNS names, in index order.
        let expected: Vec<String> = (0..3)
            .map(|p| format!("lockstep-mnist-workers-0-{p}.lockstep-mnist:8888"))
            .collect();
        for index in 0..3 {
            let annotations = [
                (
                    "jobset.sigs.k8s.io/jobset-name",
                    "lockstep-mnist".to_owned(),
                ),
                (
                    "jobset.sigs.k8s.io/replicatedjob-name",
                    replicated["name"].as_str().unwrap().to_owned(),
                ),
                ("jobset.sigs.k8s.io/job-index", "0".to_owned()),
            ];
            let mut env = environment(container, &annotations);
            env.push(("JOB_COMPLETION_INDEX".into(), index.to_string()));
            let cluster = KubernetesResolver::from_vars(env).resolve().unwrap();
            assert_eq!(cluster.rank(), Some(index));
            assert_eq!(cluster.group_addresses(), expected);
        }
    }

    #[test]
    fn the_trainjob_overrides_the_runtimes_trainer_node_and_the_resolver_finds_its_pods() {
        let docs = documents(
            &["--workers", "2", "--image", "registry.example/ls:1"],
            "trainjob.yaml",
        );
        let runtime = kind(&docs, "TrainingRuntime");
        let trainjob = kind(&docs, "TrainJob");
        for doc in [runtime, trainjob] {
            assert_eq!(doc["apiVersion"], "trainer.kubeflow.org/v1alpha1");
        }
        let reference = &trainjob["spec"]["runtimeRef"];
        assert_eq!(reference["name"], runtime["metadata"]["name"]);
        assert_eq!(reference["kind"], "TrainingRuntime");
        assert_eq!(reference["apiGroup"], "trainer.kubeflow.org");
        let trainer = &trainjob["spec"]["trainer"];
        assert_eq!(trainer["image"], "registry.example/ls:1");
        assert_eq!(trainer["numNodes"], runtime["spec"]["mlPolicy"]["numNodes"]);
        assert_eq!(trainer["numNodes"], 2);

        let template = &runtime["spec"]["template"]["spec"];
        assert_eq!(template["failurePolicy"]["maxRestarts"], 3);
        let node = &template["replicatedJobs"][0];
        assert_eq!(node["name"], "node");
        assert_eq!(
            node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"],
            "trainer"
        );
        let job = &node["template"]["spec"];
        assert_eq!(job["backoffLimit"], 0);
        let pod = &job["template"]["spec"];
        check_state_volume(&docs, &[pod], "lockstep-mnist");
        let container = &pod["containers"][0];
        assert_eq!(container["name"], "node");

        // Trainer names the JobSet after the TrainJob and merges the TrainJob's variables
        // into the runtime's.
        for index in 0..2 {
            let annotations = [
                (
                    "jobset.sigs.k8s.io/jobset-name",
                    "lockstep-mnist".to_owned(),
                ),
                ("jobset.sigs.k8s.io/replicatedjob-name", "node".to_owned()),
                ("jobset.sigs.k8s.io/job-index", "0".to_owned()),
            ];
            let mut env = environment(container, &annotations);
            env.extend(environment(trainer, &[]));
            env.push(("JOB_COMPLETION_INDEX".into(), index.to_string()));
            let cluster = KubernetesResolver::from_vars(env).resolve().unwrap();
            assert_eq!(cluster.rank(), Some(index));
            assert_eq!(
                cluster.group_addresses()[index],
                format!("lockstep-mnist-node-0-{index}.lockstep-mnist:8888")
            );
        }
    }

    #[test]
    fn the_tfjob_has_a_chief_workers_and_an_evaluator_that_the_operators_tf_config_places() {
        let docs = documents(&["--workers", "3", "--port", "2222"], "tfjob.yaml");
        let tfjob = kind(&docs, "TFJob");
        assert_eq!(tfjob["apiVersion"], "kubeflow.org/v1");
        let spec = &tfjob["spec"];
        assert_eq!(spec["runPolicy"]["backoffLimit"], 3);
        let replicas = spec["tfReplicaSpecs"].as_object().unwrap();
        let counts: Vec<(&str, u64)> = replicas
            .iter()
            .map(|(role, r)| (role.as_str(), r["replicas"].as_u64().unwrap()))
            .collect();
        assert_eq!(counts, [("Chief", 1), ("Evaluator", 1), ("Worker", 2)]);
        let pods: Vec<&Value> = replicas.values().map(|r| &r["template"]["spec"]).collect();
        check_state_volume(&docs, &pods, "lockstep-mnist");
        for replica in replicas.values() {
            assert_eq!(replica["restartPolicy"], "OnFailure");
            let container = &replica["template"]["spec"]["containers"][0];
            assert_eq!(container["name"], "tensorflow");
            assert_eq!(
                container["ports"][0],
                json!({"name": "tfjob-port", "containerPort": 2222})
            );
            assert!(
                container["args"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("--checkpoint-dir"))
            );
        }

        // The operator's TF_CONFIG: every role but the evaluator, at `<job>-<role>-<i>.<ns>.svc`.
        let address = |role: &str, i: usize| format!("lockstep-mnist-{role}-{i}.default.svc:2222");
        let cluster = json!({
            "chief": [address("chief", 0)],
            "worker": [address("worker", 0), address("worker", 1)],
        });
        for (role, index, rank) in [
            ("chief", 0, Some(0)),
            ("worker", 1, Some(2)),
            ("evaluator", 0, None),
        ] {
            let tf_config = json!({"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"});
            let resolved = TfConfigResolver::from_json(tf_config.to_string())
                .resolve()
                .unwrap();
            assert_eq!(resolved.rank(), rank, "{role}:{index}");
        }
    }

    #[test]
    fn deploy_md_explains_every_variable_the_jobset_sets() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/DEPLOY.md"),
        )
        .unwrap();
        let docs = documents(&[], "jobset.yaml");
        let container = &kind(&docs, "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            ["spec"]["containers"][0];
        for var in container["env"].as_array().unwrap() {
            let name = var["name"].as_str().unwrap();
            if name != "RUST_LOG" {
                assert!(
                    doc.contains(&format!("| `{name}` |")),
                    "docs/DEPLOY.md misses {name}"
                );
            }
        }
        for (_, annotation) in JOBSET_ANNOTATIONS {
            assert!(
                doc.contains(annotation),
                "docs/DEPLOY.md misses {annotation}"
            );
        }
    }

    #[test]
    fn a_storage_class_is_named_only_when_given() {
        let docs = documents(&[], "jobset.yaml");
        assert!(
            kind(&docs, "PersistentVolumeClaim")["spec"]
                .get("storageClassName")
                .is_none()
        );
        let docs = documents(&["--storage-class", "nfs"], "tfjob.yaml");
        assert_eq!(
            kind(&docs, "PersistentVolumeClaim")["spec"]["storageClassName"],
            "nfs"
        );
    }

    #[test]
    fn settings_no_cluster_could_run_are_refused() {
        for (flags, message) in [
            (&["--workers", "0"][..], "--workers 0"),
            (&["--cpus", "0"][..], "--cpus 0"),
            (&["--name", &"a".repeat(60)][..], "choose a shorter --name"),
        ] {
            let err = files(&args(flags)).unwrap_err();
            assert!(err.to_string().contains(message), "{flags:?}: {err}");
        }
    }

    #[test]
    fn numbers_stay_numbers_and_strings_stay_strings_in_the_yaml() {
        let docs = documents(&["--cpus", "4"], "jobset.yaml");
        let container = &kind(&docs, "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            ["spec"]["containers"][0];
        // Kubernetes wants variable values as strings, even "1".
        assert!(
            container["env"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v.get("value").is_none_or(Value::is_string))
        );
        assert_eq!(container["resources"]["requests"]["cpu"], "4");
        assert_eq!(container["ports"][0]["containerPort"], 8888);
    }
}
