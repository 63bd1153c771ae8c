"""Checks the manifests of `cargo xtask deploy k8s` against the API models that the
controllers' own projects publish, so a misspelt, misplaced or mistyped field fails here and
not on a cluster:

- Kubernetes' own objects (the volume claim, the cluster secret, and every Job and pod
  template inside the custom resources) with kubernetes-validate's schemas of Kubernetes, strictly: an unknown field is
  an error;
- JobSet, TrainingRuntime and TrainJob with the models of kubeflow-trainer-api (Kubeflow
  Trainer v2's, which include JobSet's);
- TFJob with the models of kubeflow-training (training-operator v1's SDK).

Those models skip the fields they do not know, so each object is read into its model and
written back out: a field lost on the way, or changed, is one the controller would not read.

Usage: deploy_check.py DIR   (the folder `cargo xtask deploy k8s --out DIR` wrote)
"""

import copy
import sys
from pathlib import Path

import kubeflow.training as training_v1
import kubernetes_validate
import yaml
from kubeflow_trainer_api import models as trainer_v2

KUBERNETES = "1.37.0"


def lost(written, read_back, path=""):
    """The fields of `written` that are missing or different in `read_back` (fields only in
    `read_back` are the model's defaults, and fine)."""
    if isinstance(written, dict) and isinstance(read_back, dict):
        problems = []
        for key, value in written.items():
            if key not in read_back:
                problems.append(f"{path}/{key}: not a field of the model")
            else:
                problems += lost(value, read_back[key], f"{path}/{key}")
        return problems
    if isinstance(written, list) and isinstance(read_back, list):
        if len(written) != len(read_back):
            return [f"{path}: {len(written)} items became {len(read_back)}"]
        return [p for i, (w, r) in enumerate(zip(written, read_back)) for p in lost(w, r, f"{path}[{i}]")]
    return [] if written == read_back else [f"{path}: {written!r} read back as {read_back!r}"]


def trainer_model(doc):
    """A JobSet, TrainingRuntime or TrainJob through Kubeflow Trainer's models."""
    model = {
        "JobSet": trainer_v2.JobsetV1alpha2JobSet,
        "TrainingRuntime": trainer_v2.TrainerV1alpha1TrainingRuntime,
        "TrainJob": trainer_v2.TrainerV1alpha1TrainJob,
    }[doc["kind"]]
    return model.from_dict(doc).to_dict()


def tfjob_model(doc):
    """A TFJob through training-operator v1's models."""
    client = training_v1.ApiClient()
    return client.sanitize_for_serialization(client._ApiClient__deserialize(doc, "KubeflowOrgV1TFJob"))


def validate_core(doc, what):
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as err:
        raise SystemExit(f"{what}: not a valid Kubernetes {KUBERNETES} object: {err}") from None


def as_job(job_template, what):
    validate_core(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "check", **job_template.get("metadata", {})},
         "spec": job_template["spec"]},
        what,
    )


def as_pod_template(pod_template, what):
    validate_core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": pod_template}, what)


def check_model(doc, read, what):
    problems = lost(doc, read(doc))
    if problems:
        raise SystemExit(f"{what}: the controller's model does not read it as written:\n  " + "\n  ".join(problems))


def self_test(jobset):
    """The checks can fail: a misspelt field and a wrong type are caught."""
    misspelt = copy.deepcopy(jobset)
    misspelt["spec"]["network"]["enableDNSHostname"] = True
    assert lost(misspelt, trainer_model(misspelt)), "a misspelt JobSet field went unnoticed"
    template = copy.deepcopy(jobset["spec"]["replicatedJobs"][0]["template"])
    template["spec"]["template"]["spec"]["containers"][0]["port"] = 1
    try:
        as_job(template, "self-test")
    except SystemExit:
        return
    raise AssertionError("a misspelt container field went unnoticed")


def main(folder):
    checked = 0
    for file in ["jobset.yaml", "trainjob.yaml", "tfjob.yaml", "cluster-secret.yaml"]:
        for doc in yaml.safe_load_all((folder / file).read_text()):
            what = f"{file}: {doc['kind']} {doc['metadata']['name']}"
            kind = doc["kind"]
            if kind in ("PersistentVolumeClaim", "Secret"):
                validate_core(doc, what)
            elif kind == "JobSet":
                self_test(doc)
                check_model(doc, trainer_model, what)
                for job in doc["spec"]["replicatedJobs"]:
                    as_job(job["template"], f"{what}, replicated job {job['name']}")
            elif kind == "TrainingRuntime":
                check_model(doc, trainer_model, what)
                for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
                    as_job(job["template"], f"{what}, replicated job {job['name']}")
            elif kind == "TrainJob":
                check_model(doc, trainer_model, what)
            elif kind == "TFJob":
                check_model(doc, tfjob_model, what)
                for role, replica in doc["spec"]["tfReplicaSpecs"].items():
                    as_pod_template(replica["template"], f"{what}, {role}")
            else:
                raise SystemExit(f"{what}: no check for kind {kind}")
            print(f"ok: {what}")
            checked += 1
    if checked != 8:
        raise SystemExit(
            f"expected 8 objects (3 volume claims, JobSet, TrainingRuntime, TrainJob, TFJob, the cluster secret), checked {checked}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
