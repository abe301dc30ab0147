"""deploy/kubernetes stays in step with the code, as docker-compose.yml does: every overlay
renders offline (``kubectl kustomize``) and validates against the Kubernetes schema
(``kubernetes-validate``), and every image, command, port, target and environment variable
resolves to code and to containers that exist."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lenserve.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
K8S_VERSION = "1.30.0"      # the oldest version the manifests promise to run on


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl here to render the kustomization")
    out = subprocess.run(["kubectl", "kustomize", str(KUBE / "overlays" / request.param)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def _containers(docs):
    for w in _workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            yield w, c


def _lenserve(docs):
    return [(w, c) for w, c in _containers(docs) if c["image"].split(":")[0] == "lenserve"]


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _ports(container) -> set[int]:
    return {p["containerPort"] for p in container.get("ports", [])}


def test_every_overlay_validates_against_the_kubernetes_schema(rendered):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_lenserve_commands_parse_to_code_that_exists(rendered):
    parser = build_parser()
    for w, c in _lenserve(rendered):
        if "command" in c:          # the Celery worker: the app must define its task
            app = c["command"][c["command"].index("-A") + 1]
            assert hasattr(__import__(app, fromlist=["retrain_mlp"]), "retrain_mlp")
            continue
        args = parser.parse_args(c["args"])
        assert callable(args.func), (w["metadata"]["name"], c["name"])


def test_every_environment_variable_is_read_by_the_code(rendered):
    sources = "\n".join(p.read_text() for pkg in ("services", "gateway")
                         for p in (ROOT / pkg).rglob("*.py"))
    config = next(d for d in rendered if d["kind"] == "ConfigMap")
    names = set(config["data"])
    for _, c in _lenserve(rendered):
        names |= {e["name"] for e in c.get("env", [])}
    for name in names:
        assert name in sources, f"{name} is set in deploy/kubernetes but nothing reads it"


def test_each_service_listens_on_its_port_and_is_probed_there(rendered):
    for w, c in _lenserve(rendered):
        if "args" not in c:
            continue
        port = int(_flag(c["args"], "--port"))
        assert port in _ports(c), (c["name"], port)
        assert _flag(c["args"], "--host") == "0.0.0.0"     # the kubelet probes the pod IP
        probes = [c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c]
        assert probes, c["name"]
        for probe in probes:
            target = probe.get("grpc") or probe.get("httpGet")
            assert target["port"] == port, (c["name"], probe)


def _service_ports(docs) -> dict[str, tuple[dict, set[int]]]:
    return {d["metadata"]["name"]: (d, {p["port"] for p in d["spec"]["ports"]})
            for d in docs if d["kind"] == "Service"}


def _pod_of(docs, service: dict):
    selector = service["spec"]["selector"]
    return next(w for w in _workloads(docs) if
                selector.items() <= w["spec"]["template"]["metadata"]["labels"].items())


def test_every_service_selects_a_pod_whose_container_listens_on_its_target(rendered):
    for name, (svc, _) in _service_ports(rendered).items():
        pod = _pod_of(rendered, svc)
        listening = set().union(*(_ports(c) for c in pod["spec"]["template"]["spec"]["containers"]))
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in listening, (name, p)


def test_grpc_targets_name_a_service_or_a_container_of_the_same_pod(rendered):
    services = _service_ports(rendered)
    for w, c in _lenserve(rendered):
        own = set().union(*(_ports(x) for x in w["spec"]["template"]["spec"]["containers"]))
        for flag in ("--executor", "--predictor", "--kvmanager", "--scheduler", "--replicas"):
            target = _flag(c.get("args", []), flag)
            if target is None:
                continue
            host, port = target.split("://", 1)[1].rsplit(":", 1)
            if host == "127.0.0.1":
                assert int(port) in own, (c["name"], target)
                continue
            assert host in services and int(port) in services[host][1], (c["name"], target)
            if target.startswith("dns://"):     # one address per pod, not a virtual IP
                assert services[host][0]["spec"].get("clusterIP") == "None", target


def test_images_are_the_lenserve_image_or_the_versions_compose_pins(rendered):
    pinned = {s["image"] for s in COMPOSE["services"].values() if "image" in s}
    assert (ROOT / "Dockerfile").exists()
    for _, c in _containers(rendered):
        assert c["image"].split(":")[0] == "lenserve" or c["image"] in pinned, c["image"]


def test_a_replica_is_scheduler_executor_and_kvmanager_sharing_dev_shm(rendered):
    replica = next(w for w in _workloads(rendered) if w["metadata"]["name"] == "replica")
    spec = replica["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in spec["containers"]}
    assert set(by_name) == {"scheduler", "executor", "kvmanager"}
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    for name in ("executor", "kvmanager"):
        assert {"name": "shm", "mountPath": "/dev/shm"} in by_name[name]["volumeMounts"]
    gpu = by_name["executor"]["resources"]["limits"].get("nvidia.com/gpu")
    device = _flag(by_name["executor"]["args"], "--device")
    assert (gpu, device) in ((1, "cuda"), (None, "cpu"))     # one GPU per replica, or none


def test_gateway_and_router_scale_on_the_queue_the_gateway_exports(rendered):
    from gateway.metrics import STAT_GAUGES
    exported = {name for name, _ in STAT_GAUGES.values()}
    hpas = {d["spec"]["scaleTargetRef"]["name"]: d for d in rendered
            if d["kind"] == "HorizontalPodAutoscaler"}
    assert set(hpas) == {"gateway", "router"}
    for hpa in hpas.values():
        metrics = [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]
                   if m["type"] == "External"]
        assert metrics and set(metrics) <= exported


def test_every_lenserve_workload_has_a_disruption_budget_and_resources(rendered):
    budgets = [d["spec"]["selector"]["matchLabels"] for d in rendered
               if d["kind"] == "PodDisruptionBudget"]
    for w, c in _containers(rendered):
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
    for w in {id(w): w for w, _ in _lenserve(rendered)}.values():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(b.items() <= labels.items() for b in budgets), w["metadata"]["name"]


def test_policies_named_in_the_config_exist(rendered):
    from services.router.policies import POLICIES as ROUTER_POLICIES
    from services.scheduler.policies import POLICIES
    data = next(d for d in rendered if d["kind"] == "ConfigMap")["data"]
    assert data["LENSERVE_POLICY"] in POLICIES
    assert data["LENSERVE_ROUTER_POLICY"] in ROUTER_POLICIES
