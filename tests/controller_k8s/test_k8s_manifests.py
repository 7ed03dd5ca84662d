"""deploy/k8s: every manifest parses, every object deserialises with the official client's models
without losing a field, the Role grants exactly what the runner calls, the example job template
renders into a valid Job, and every KERAUNOS_* variable names a real setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from keraunos.controller.config import ControllerConfig
from keraunos.controller.runners._k8s_render import JobSettings, render_job
from keraunos.gateway.config import GatewayConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"

MODELS = {
    "Namespace": "V1Namespace",
    "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "ConfigMap": "V1ConfigMap",
    "Job": "V1Job",
}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path.name, doc))
    return found


def round_trip(obj: dict[str, Any], model: str) -> Any:
    from kubernetes.client import ApiClient

    client = ApiClient()
    return client.sanitize_for_serialization(client._ApiClient__deserialize(obj, model))  # type: ignore[attr-defined]


def test_the_deploy_directory_holds_the_gateway_controller_rbac_and_template() -> None:
    kinds = sorted((name, doc["kind"]) for name, doc in manifests())
    assert kinds == [
        ("controller.yaml", "Deployment"),
        ("gateway.yaml", "Deployment"),
        ("gateway.yaml", "PersistentVolumeClaim"),
        ("gateway.yaml", "Service"),
        ("job-template.yaml", "ConfigMap"),
        ("namespace.yaml", "Namespace"),
        ("rbac.yaml", "Role"),
        ("rbac.yaml", "RoleBinding"),
        ("rbac.yaml", "ServiceAccount"),
    ]


@pytest.mark.parametrize(("file", "obj"), manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_object_deserialises_with_the_kubernetes_models_without_losing_a_field(
    file: str, obj: dict[str, Any]
) -> None:
    assert round_trip(obj, MODELS[obj["kind"]]) == obj


def test_the_role_grants_exactly_the_calls_the_runner_makes() -> None:
    (role,) = [doc for _, doc in manifests() if doc["kind"] == "Role"]
    granted = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted == {
        ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
        ("", "pods"): {"list"},
        ("", "pods/log"): {"get"},
    }


def test_the_example_job_template_renders_a_job_the_models_accept() -> None:
    (config_map,) = [doc for _, doc in manifests() if doc["kind"] == "ConfigMap"]
    job = render_job(
        config_map["data"]["job-template.yaml"],
        name="kr-r1-0123abcd",
        rollout_id="r1",
        attempt_id="1",
        rollout_input={"question": 'say "hi"\n---\nkind: Secret'},
        timeout_s=600,
        env={"AGL_OPENAI_BASE_URL": "u", "AGL_EVENT_URL": "e", "AGL_KEY": "k"},
        settings=JobSettings(namespace="keraunos", instance="keraunos", ttl_s=3600),
    )
    assert round_trip(job, "V1Job") == job
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["QUESTION"] == 'say "hi"\n---\nkind: Secret'


def test_every_keraunos_variable_in_the_deployments_names_a_setting() -> None:
    prefixes = {"KERAUNOS_GATEWAY_": GatewayConfig, "KERAUNOS_CONTROLLER_": ControllerConfig}
    seen = 0
    for _, doc in manifests():
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                for prefix, settings in prefixes.items():
                    if var["name"].startswith(prefix):
                        assert var["name"][len(prefix) :].lower() in settings.model_fields, var["name"]
                        seen += 1
    assert seen >= 10
