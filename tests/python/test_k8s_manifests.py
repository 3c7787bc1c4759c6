"""The env contract of the Kubernetes manifests in examples/k8s (issue 15):
each manifest's pods, given the variables Kubernetes (indexed Job) or Open
MPI (MPIJob) would give them plus the manifest's own, form one correct job.
No cluster here: the pods run as local processes, with the in-cluster names
(the headless Service's pod 0, the pod IP) replaced by loopback and the
Secret by a temporary file. What is checked is what the manifests rely on:
which variables hora reads, that the world size and the store agree, and
that every rank finds its identity without HORA_RANK."""
import os

import pytest

from harness import REPO, free_port
from test_launcher_env import clean_env, results, run_ranks

yaml = pytest.importorskip("yaml")

K8S = os.path.join(REPO, "examples", "k8s")


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return list(yaml.safe_load_all(f))


def container_env(container, in_cluster, secret_file):
    """The container's env list as a dict, with in-cluster values replaced."""
    env = {}
    for e in container.get("env", []):
        name = e["name"]
        if "valueFrom" in e:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, e
            env[name] = "127.0.0.1"  # the pod IP
        else:
            env[name] = in_cluster.get(e["value"], e["value"])
    if "HORA_SECRET_FILE" in env:
        env["HORA_SECRET_FILE"] = secret_file
    return env


@pytest.fixture
def secret_file(tmp_path):
    p = tmp_path / "secret"
    p.write_text("0123456789abcdef0123456789abcdef")
    os.chmod(p, 0o400)
    return str(p)


def test_indexed_job(secret_file):
    docs = load("indexed-job.yaml")
    svc = next(d for d in docs if d["kind"] == "Service")
    job = next(d for d in docs if d["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n, "every rank must run at once"
    pod = spec["template"]["spec"]
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    store = "%s-0.%s" % (job["metadata"]["name"], pod["subdomain"])  # pod 0 = rank 0
    env = container_env(pod["containers"][0], {store: "127.0.0.1"}, secret_file)
    assert env.get("HORA_SIZE") == str(n), "HORA_SIZE must equal completions"
    assert "HORA_RANK" not in env, "the rank comes from JOB_COMPLETION_INDEX"
    env["HORA_STORE_PORT"] = str(free_port())  # this machine's, not the manifest's fixed port
    envs = [clean_env(dict(env, JOB_COMPLETION_INDEX=i)) for i in range(n)]
    codes, outs = run_ranks(envs)
    assert codes == [0] * n, "\n---\n".join(outs)
    res = results(outs)
    assert [r["rank"] for r in res] == list(range(n))
    for r in res:
        assert r["size"] == n and r["sum"] == [float(n * (n + 1) // 2)] * 4


def test_mpijob(secret_file):
    (job,) = load("mpijob.yaml")
    assert job["kind"] == "MPIJob"
    name = job["metadata"]["name"]
    replicas = job["spec"]["mpiReplicaSpecs"]
    workers = replicas["Worker"]["replicas"]
    slots = job["spec"]["slotsPerWorker"]
    cmd = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[0] == "mpirun"
    n = int(cmd[cmd.index("-np") + 1])
    assert n == workers * slots, "-np must fill every worker's slots"
    exported = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-x")
    store = "%s-worker-0.%s-worker" % (name, name)  # rank 0 runs on worker 0
    assert exported.get("HORA_STORE_ADDR") == store
    env = {k: ("127.0.0.1" if v == store else v) for k, v in exported.items()}
    env["HORA_SECRET_FILE"] = secret_file
    mounts = replicas["Worker"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == os.path.dirname(exported["HORA_SECRET_FILE"]) for m in mounts)
    env["HORA_STORE_PORT"] = str(free_port())
    # What Open MPI gives each rank (by-slot mapping: worker w holds ranks w*slots..).
    envs = [clean_env(dict(env, OMPI_COMM_WORLD_RANK=r, OMPI_COMM_WORLD_SIZE=n,
                           OMPI_COMM_WORLD_LOCAL_RANK=r % slots, OMPI_COMM_WORLD_LOCAL_SIZE=slots))
            for r in range(n)]
    codes, outs = run_ranks(envs)
    assert codes == [0] * n, "\n---\n".join(outs)
    res = results(outs)
    assert [r["rank"] for r in res] == list(range(n))
    for r in res:
        assert r["size"] == n and r["local_size"] == slots
        assert r["sum"] == [float(n * (n + 1) // 2)] * 4
