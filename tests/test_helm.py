"""The Helm chart (deploy/helm/durable): rendered by Helm's own engine (helm-python-sdk
binds Helm's Go SDK; no helm binary, no cluster), every object checked against the
Kubernetes API schemas (kubernetes-validate, strict: an unknown field fails) and KEDA's
objects against KEDA's own models (cloudcoil-models-keda); the probes it declares asked of
the real processes it starts, with the commands it renders."""

from __future__ import annotations

import json
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable.backend.embedded import free_port
from durable.log import keys
from durable.settings import Settings, variables
from durable.testing import Server, wait_for
from durable.testing.processes import Process

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) has no "
                           "wheel for this platform")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
keda = pytest.importorskip("cloudcoil.models.keda.v1alpha1")

CHART = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "durable"
#: The oldest Kubernetes the chart declares (Chart.yaml's kubeVersion).
KUBE = "1.25"

#: What the smallest install needs: the Redis URL, its password, the console's users.
MINIMAL: dict[str, Any] = {
    "redis": {"url": "redis://redis.data.svc:6379/0"},
    "secret": {"data": {"redis-password": "pw", "console-users": "[users]"}},
}
#: Every option on: a cluster with its queue server, ACL users, TLS with client
#: certificates, KEDA on three ready lists and Prometheus, agents from a volume.
EVERYTHING: dict[str, Any] = {
    "agents": "shop.agents",
    "agentsVolume": {"configMap": {"name": "shop-agents"}},
    "redis": {"url": "rediss://redis-cluster.data.svc:6379", "cluster": True, "shards": 32,
              "queueUrl": "rediss://redis-queue.data.svc:6380/2", "minReplicas": 1,
              "acl": True, "tls": {"secretName": "redis-tls", "clientCert": True}},
    "secret": {"existing": "durable-keys"},
    "env": {"DURABLE_RETENTION": "30d", "DURABLE_QUEUE": "agents"},
    "worker": {"concurrency": 1000, "shutdownGraceSeconds": 25},
    "console": {"secureCookies": True},
    "autoscaling": {"enabled": True, "agents": ["", "checkout", "support_bot", "checkout@2"],
                    "prometheus": {"serverAddress": "http://prometheus.monitoring:9090"}},
    "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name="prod", namespace="agents", is_install=True)
    return [doc for name, text in sorted(files.items()) if name.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deploy in by_kind(objects, "Deployment").items():
        for container in deploy["spec"]["template"]["spec"]["containers"]:
            yield name, container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("values", [MINIMAL, EVERYTHING], ids=["minimal", "everything"])
def test_every_object_the_chart_renders_is_valid(values: dict[str, Any]) -> None:
    """Core objects against the Kubernetes schemas in strict mode (a misspelt or misplaced
    field fails); ScaledObject and TriggerAuthentication against KEDA's models, which must
    also give back every field (a field KEDA does not know would be dropped)."""
    objects = render(values)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "Service", "ServiceAccount"} <= kinds
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            model = getattr(keda, obj["kind"]).model_validate(obj)
            assert model.model_dump(by_alias=True, exclude_none=True) == obj, obj["kind"]
        else:  # the oldest Kubernetes the chart supports, and the newest known
            for version in (KUBE, kubernetes_validate.latest_version()):
                kubernetes_validate.validate(obj, version, strict=True)
    assert helm.lint(CHART, values, strict=True)["errors"] == []


def test_minimal_install_runs_every_process_but_no_autoscaler() -> None:
    deploys = by_kind(render(MINIMAL), "Deployment")
    assert sorted(deploys) == ["prod-durable-console", "prod-durable-metrics",
                               "prod-durable-reconciler", "prod-durable-worker"]
    assert deploys["prod-durable-worker"]["spec"]["replicas"] == 2
    assert deploys["prod-durable-reconciler"]["spec"]["replicas"] == 1
    assert not [o for o in render(MINIMAL) if o["apiVersion"].startswith("keda.sh/")]


def test_a_worker_has_time_to_hand_its_runs_back() -> None:
    """Killed only after DURABLE_SHUTDOWN_GRACE_S and the hand-back, evicted one at a
    time, and a rollout adds workers before it stops one."""
    objects = render(EVERYTHING)
    worker = by_kind(objects, "Deployment")["prod-durable-worker"]["spec"]
    grace = float(by_kind(objects, "ConfigMap")["prod-durable"]["data"]
                  ["DURABLE_SHUTDOWN_GRACE_S"])
    assert grace == 25
    assert worker["template"]["spec"]["terminationGracePeriodSeconds"] >= grace + 10
    assert worker["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = by_kind(objects, "PodDisruptionBudget")["prod-durable-worker"]["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"] == worker["selector"]["matchLabels"]


@pytest.mark.parametrize("values", [MINIMAL, EVERYTHING], ids=["minimal", "everything"])
def test_no_process_runs_as_root_or_can_write_its_image(values: dict[str, Any]) -> None:
    objects = render(values)
    for name, deploy in by_kind(objects, "Deployment").items():
        pod = deploy["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name


def test_every_setting_the_chart_sets_is_a_setting_of_the_processes() -> None:
    """A DURABLE_* name the settings do not know would be ignored without a word."""
    objects = render(EVERYTHING)
    known = set(variables())
    config = by_kind(objects, "ConfigMap")["prod-durable"]["data"]
    names = set(config)
    for _, c in containers(objects):
        names |= set(env_of(c))
    assert names <= known, names - known
    assert config["DURABLE_REDIS_CLUSTER"] == "true" and config["DURABLE_SHARDS"] == "32"
    assert config["DURABLE_QUEUE_URL"] == "rediss://redis-queue.data.svc:6380/2"
    assert config["DURABLE_CONCURRENCY"] == "1000"
    assert config["DURABLE_REDIS_TLS_CA"] == "/etc/durable/tls/ca.crt"


@pytest.mark.parametrize("values", [MINIMAL, EVERYTHING], ids=["minimal", "everything"])
def test_every_command_the_chart_runs_is_one_the_cli_accepts(values: dict[str, Any]) -> None:
    from durable.cli.main import build_parser

    for name, c in containers(render(values)):
        assert c["command"][0] == "durable", name
        build_parser().parse_args(c["command"][1:])


def test_passwords_and_keys_come_from_the_secret_each_process_as_its_role() -> None:
    objects = render(EVERYTHING)
    roles = {"prod-durable-worker": "worker", "prod-durable-reconciler": "reconciler",
             "prod-durable-console": "operator", "prod-durable-metrics": "operator"}
    for name, c in containers(objects):
        env = env_of(c)
        assert env["DURABLE_REDIS_USERNAME"]["value"] == roles[name]
        ref = env["DURABLE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "durable-keys", "key": f"{roles[name]}-password"}
        for var, key in (("DURABLE_ENCRYPTION_KEYS", "encryption-keys"),
                         ("DURABLE_ADMIN_KEYS", "admin-keys"),
                         ("DURABLE_CANCEL_SECRET", "cancel-secret")):
            assert env[var]["valueFrom"]["secretKeyRef"] == {
                "name": "durable-keys", "key": key, "optional": True}
    assert not by_kind(objects, "Secret").get("prod-durable-secrets")  # an existing one
    config = json.dumps(by_kind(objects, "ConfigMap"))
    assert "password" not in config.lower()
    minimal = render(MINIMAL)
    made = by_kind(minimal, "Secret")["prod-durable-secrets"]
    assert made["stringData"]["redis-password"] == "pw"
    for _, c in containers(minimal):
        assert "DURABLE_REDIS_USERNAME" not in env_of(c)
        assert env_of(c)["DURABLE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == \
            "redis-password"


def test_tls_files_and_agents_are_mounted_read_only() -> None:
    for name, c in containers(render(EVERYTHING)):
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["redis-tls"] == {"name": "redis-tls", "mountPath": "/etc/durable/tls",
                                       "readOnly": True}, name
        assert mounts["agents"]["mountPath"] == "/agents" and mounts["agents"]["readOnly"]


def test_each_process_accepts_connections_only_on_the_port_it_serves() -> None:
    objects = render(EVERYTHING)
    policies = by_kind(objects, "NetworkPolicy")
    deploys = by_kind(objects, "Deployment")
    assert sorted(policies) == sorted(deploys)
    for name, policy in policies.items():
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"] == \
            deploys[name]["spec"]["selector"]["matchLabels"]
        assert spec["policyTypes"] == ["Ingress"]
        served = sorted(p["containerPort"] for c in
                        deploys[name]["spec"]["template"]["spec"]["containers"]
                        for p in c.get("ports", []))
        allowed = sorted(port["port"] for rule in spec["ingress"] for port in rule["ports"])
        assert allowed == served, name
    for scraped in ("prod-durable-reconciler", "prod-durable-worker"):
        assert policies[scraped]["spec"]["ingress"][0]["from"] == \
            EVERYTHING["networkPolicy"]["metricsFrom"]
    assert policies["prod-durable-console"]["spec"]["ingress"][0]["from"] == [
        {"podSelector": {}}]
    assert not by_kind(render(MINIMAL), "NetworkPolicy")


def test_keda_scales_workers_on_the_ready_lists_the_queue_fills() -> None:
    """Each trigger's list is the one ``durable.queue`` pushes that agent's runs on, on
    the queue's server (DURABLE_QUEUE_URL: its host, database, TLS)."""
    objects = render(EVERYTHING)
    scaled = by_kind(objects, "ScaledObject")["prod-durable-worker"]["spec"]
    assert scaled["scaleTargetRef"] == {"name": "prod-durable-worker"}
    redis_triggers = [t for t in scaled["triggers"] if t["type"] == "redis"]
    assert [t["metadata"]["listName"] for t in redis_triggers] == [
        keys.ready("agents"), keys.ready("agents", "checkout"),
        keys.ready("agents", "support_bot"), keys.ready("agents", "checkout@2")]
    assert [t["name"] for t in redis_triggers] == [
        "ready-shared", "ready-checkout", "ready-support-bot", "ready-checkout-2"]
    for t in redis_triggers:
        assert t["metadata"]["address"] == "redis-queue.data.svc:6380"
        assert t["metadata"]["databaseIndex"] == "2"
        assert t["metadata"]["enableTLS"] == "false"  # TLS is the authentication's (a CA)
        assert t["authenticationRef"] == {"name": "prod-durable-redis"}
    [prom] = [t for t in scaled["triggers"] if t["type"] == "prometheus"]
    assert prom["metadata"]["query"] == 'sum(durable_runs{state="pending"})'
    assert prom["metadata"]["threshold"] == "750"  # 3/4 of the 1000 slots of a worker
    auth = by_kind(objects, "TriggerAuthentication")["prod-durable-redis"]["spec"]
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["secretTargetRef"]}
    assert refs["password"] == ("durable-keys", "autoscaler-password")
    assert refs["username"] == ("prod-durable-autoscaler", "username")
    assert refs["ca"] == ("redis-tls", "ca.crt")
    assert refs["tls"] == ("prod-durable-autoscaler", "tls")
    made = by_kind(objects, "Secret")["prod-durable-autoscaler"]["stringData"]
    assert made == {"username": "autoscaler", "tls": "enable"}
    system_cas = render({**EVERYTHING, "redis": {**EVERYTHING["redis"], "tls": {}}})
    for t in by_kind(system_cas, "ScaledObject")["prod-durable-worker"]["spec"]["triggers"]:
        assert t["type"] == "prometheus" or t["metadata"]["enableTLS"] == "true"
    worker = by_kind(objects, "Deployment")["prod-durable-worker"]["spec"]
    assert "replicas" not in worker  # KEDA's HPA owns the count


@pytest.mark.parametrize(("values", "error"), [
    ({}, "redis.url is required"),
    ({"redis": {"url": "http://redis:6379"}}, "at '/redis/url'"),
    ({"redis": {"url": "redis://:secret@redis:6379/0"}}, "must not hold a password"),
    ({"redis": {"url": "redis://r:6379", "cluster": True}}, "redis.queueUrl is required"),
    ({"redis": {"url": "redis://r:6379", "tls": {"secretName": "t"}}}, "not rediss://"),
    ({"redis": {"url": "redis://r:6379"}, "secret": {"data": {"console-users": "x"}}},
     "secret.data.redis-password is required"),
    ({"redis": {"url": "redis://r:6379"}, "secret": {"data": {"redis-password": "x"}}},
     "secret.data.console-users is required"),
    ({**MINIMAL, "redis": {"url": "redis://r:6379", "acl": True}},
     "secret.data.worker-password is required"),
    ({**MINIMAL, "redis": {"url": "redis://r"}, "autoscaling": {"enabled": True}},
     "must name its port"),
    ({**MINIMAL, "autoscaling": {"enabled": True, "prometheus": {"serverAddress": "http://p"}}},
     "autoscaling.prometheus.runsPerWorker is required"),
    ({**MINIMAL, "workers": {"replicas": 3}}, "workers"),
    ({**MINIMAL, "worker": {"concurency": 100}}, "concurency"),
    ({**MINIMAL, "worker": {"replicas": "three"}}, "replicas"),
    ({**MINIMAL, "env": {"REDIS_URL": "redis://x"}}, "REDIS_URL"),
    ({**MINIMAL, "secret": {"data": {"redis-pasword": "x"}}}, "redis-pasword"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_wrong_value_fails_the_render_naming_it(values: dict[str, Any], error: str) -> None:
    with pytest.raises(helm.HelmError) as caught:
        render(values)
    assert error in str(caught.value), str(caught.value)


def _probe(port: int, path: str) -> int:
    """The HTTP status of a GET (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _answers(port: int, path: str, *, any_status: bool = False) -> Callable[[], bool]:
    def check() -> bool:
        status = _probe(port, path)
        return status != 0 if any_status else status == 200
    return check


def test_the_probes_answer_on_the_processes_the_chart_starts(
        server: Server, settings: Settings, tmp_path: Path) -> None:
    """Each Deployment's command, as rendered, run for real against the test's Redis with
    the rendered settings: its startup, liveness and readiness probes get 200."""
    from durable.security.users import hash_password

    ports = {"worker": free_port(), "console": free_port(), "metrics": free_port(),
             "reconciler": free_port()}
    objects = render({**MINIMAL, "agents": "examples.agents",
                      "worker": {"metricsPort": ports["worker"]},
                      "reconciler": {"probePort": ports["reconciler"]},
                      "console": {"port": ports["console"]},
                      "metrics": {"port": ports["metrics"]}})
    config = by_kind(objects, "ConfigMap")["prod-durable"]["data"]
    users = tmp_path / "users.toml"
    users.write_text(f'[users.ops]\npassword = "{hash_password("pw")}"\nroles = ["operator"]\n')
    started: list[tuple[str, Process, dict[str, Any]]] = []
    try:
        for name, c in containers(objects):
            component = name.removeprefix("prod-durable-")
            assert c["command"][0] == "durable"
            env = {k: v for k, v in config.items() if k != "DURABLE_REDIS_URL"}
            env["DURABLE_CONSOLE_USERS"] = str(users)
            started.append((component, Process(server.url, c["command"][1:],
                                               log_path=tmp_path / f"{component}.log", **env),
                            c))
        for component, _, c in started:
            probes = [c[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")
                      if p in c]
            assert probes, component
            named = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in probes:
                if "tcpSocket" in probe:  # any HTTP answer: it listens
                    ok = _answers(named[probe["tcpSocket"]["port"]], "/", any_status=True)
                else:
                    ok = _answers(named[probe["httpGet"]["port"]], probe["httpGet"]["path"])
                assert wait_for(ok, 30), (component, probe,
                                          (tmp_path / f"{component}.log").read_text())
        assert all(proc.alive() for _, proc, _ in started), [
            (component, (tmp_path / f"{component}.log").read_text())
            for component, proc, _ in started if not proc.alive()]
    finally:
        for _, proc, _ in started:
            proc.stop()


def test_the_chart_packages(tmp_path: Path) -> None:
    """What an operator installs from: `helm package` of the chart."""
    archive = Path(helm.package(CHART, destination=tmp_path))
    assert archive.name == "durable-0.1.0.tgz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "durable/values.schema.json" in names and "durable/templates/worker.yaml" in names
