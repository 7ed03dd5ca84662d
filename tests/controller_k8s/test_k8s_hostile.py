"""Hostile templates and inputs through the real reconcile loop: a `keraunos controller --runner k8s`
process, the real gateway and the Kubernetes stand-in. Whatever a batch of rollouts brings (random
templates built from hostile pieces, the ones that stopped the controller before), each of them
ends, the controller stays up and keeps its metrics, and a bystander's running Job is not touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_support import (
    TEMPLATE,
    Controller,
    K8sEnv,
    create_rollouts,
    detail,
    end_leftovers,
    rollout,
    start_controller,
    wait_for,
    wait_terminal,
)

from keraunos.controller.runners._k8s_names import job_name
from keraunos.testing.processes import free_port

pytestmark = pytest.mark.timeout(300)

#: Templates that stopped the controller, hung their rollout in running, or amplified, before.
KNOWN = [
    "{{ input.question + 1 }}",
    "{{ 1/0 }}",
    "{{ input.question | length + input.question }}",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "{% for i in range(10**12) %}{% endfor %}",
    TEMPLATE.replace("{{ input.question | yaml_escape }}", "{{ input.day }}"),  # a date
    TEMPLATE.replace("{{ input.question | yaml_escape }}", "!!binary aGVsbG8="),
    TEMPLATE.replace("{{ input.question | yaml_escape }}", "!!set {a, b}"),
    "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    + TEMPLATE.replace("args: [", "args: [*c, "),
    "kind: Job\nspec: &s {template: {spec: {containers: [{name: a, image: x, x: *s}]}}}\n",
    TEMPLATE.replace("labels:", "labels: {{ input }}\n  x:"),
    "{{ 'x' * 10**8 }}",
]

_pieces = st.sampled_from(
    [
        "{{ input.question }}",
        "{{ input.question | yaml_escape }}",
        "{{ input.question | length }}",
        "{{ input.question + 1 }}",
        "{{ input.n // input.zero }}",
        "{{ input.day }}",
        "$(AGL_KEY)",
        "&a [1]",
        "*a",
        "!!binary",
        "!!set",
        ": ",
        "\n- ",
        "[",
        "]",
        "{",
        "---\n",
        "{% for i in range(input.n) %}{{ i }},{% endfor %}",
    ]
)
_hostile_templates = st.one_of(
    st.sampled_from(KNOWN),
    st.lists(_pieces, max_size=8).map("".join),
    st.lists(_pieces, max_size=4).map(lambda parts: TEMPLATE.replace("args: [", "args: [" + "".join(parts))),
)
_questions = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20) | st.sampled_from(
    ["$(AGL_KEY)", "2024-05-01", "*a", "{{ 1/0 }}"]
)


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def controller(k8s_session: K8sEnv, metrics_port: int) -> Iterator[Controller]:
    started = start_controller(
        k8s_session,
        "hostile",
        "--k8s-max-jobs-per-minute",
        "6000",
        "--k8s-job-burst",
        "100",
        "--metrics-port",
        str(metrics_port),
    )
    yield started
    started.stop()
    end_leftovers(k8s_session.gateway)


def hostile_rollout(template: str, question: str) -> dict[str, Any]:
    item = rollout("ok", question=question, template=template)
    item["input"].update({"day": "2024-05-01", "n": 3, "zero": 0})
    return item


def job_running(env: K8sEnv, name: str) -> bool:
    with env.kube.client() as api:
        response = api.get(f"/apis/batch/v1/namespaces/{env.kube.namespace}/jobs/{name}")
    if response.status_code != 200:
        return False
    conditions = response.json().get("status", {}).get("conditions") or []
    return not any(c["status"] == "True" and c["type"] in ("Complete", "Failed") for c in conditions)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(_hostile_templates, _questions), min_size=4, max_size=10))
def test_any_batch_of_hostile_templates_ends_every_rollout_and_leaves_a_bystanders_job_alone(
    k8s_session: K8sEnv, controller: Controller, tmp_path_factory: pytest.TempPathFactory, batch: list[Any]
) -> None:
    env = k8s_session
    release = tmp_path_factory.mktemp("bystander") / "release"
    (bystander,) = create_rollouts(env.gateway, [rollout("wait", str(release))])
    bystander_job = job_name(bystander, "1")
    wait_for(lambda: job_running(env, bystander_job), 30, "the bystander's Job to run")
    deletes = env.kube.controls.count("delete", "jobs")

    items = [hostile_rollout(template, question) for template, question in batch]
    items += [hostile_rollout(template, "q") for template in KNOWN]
    ids = create_rollouts(env.gateway, items)
    # Every rollout ends within the lease (10 s) and then some; none hangs in running.
    details = wait_terminal(env.gateway, ids, timeout=60)
    for rollout_id in ids:
        (attempt,) = details[rollout_id]["attempt_details"]
        assert attempt["outcome"] in ("succeeded", "failed"), attempt
        if attempt["outcome"] == "failed":
            assert attempt["reason"], attempt

    assert controller.process.poll() is None, controller.log()[-3000:]
    assert job_running(env, bystander_job)  # untouched: not deleted, not reported lost
    assert env.kube.controls.count("delete", "jobs") == deletes
    assert detail(env.gateway, bystander)["rollout"]["status"]["state"] == "running"
    release.touch()
    got = wait_terminal(env.gateway, [bystander], timeout=30)[bystander]
    assert got["rollout"]["status"]["state"] == "succeeded"


def test_the_known_hostile_templates_fail_with_their_reasons_and_a_data_reference_stays_text(
    k8s_session: K8sEnv, controller: Controller
) -> None:
    env = k8s_session
    ids = create_rollouts(env.gateway, [hostile_rollout(t, "q") for t in KNOWN])
    probe = rollout("ok", question="$(AGL_KEY)")
    (probe_id,) = create_rollouts(env.gateway, [probe])
    details = wait_terminal(env.gateway, [*ids, probe_id], timeout=60)
    reasons = [details[r]["attempt_details"][0]["reason"] or "" for r in ids]
    # Each fails with why: the template's own error, or the API's refusal of what it made.
    assert [r for r in reasons if not r.startswith(("job template:", "the Kubernetes API refused"))] == []
    for expected, reason in zip(
        [
            "TypeError",
            "ZeroDivisionError",
            "TypeError",
            "recursion",
            "range()",
            "a date",
            "binary",
            "a set",
            "alias",
            "alias",
        ],
        reasons,
        strict=False,
    ):
        assert expected in reason, reason
    assert details[probe_id]["rollout"]["status"]["state"] == "succeeded"
    with env.gateway.client() as api:
        events = api.get(f"/api/rollouts/{probe_id}/events").json()
    (call,) = [e for e in events if e["event_type"] == "model_request"]
    assert "$(AGL_KEY)" in str(call)  # the agent sent the question as it was, not its token


def test_the_controller_serves_its_metrics_under_the_servers_key(
    k8s_session: K8sEnv, controller: Controller, metrics_port: int
) -> None:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"x-api-key": "wrong"}).status_code == 401
    for headers in (
        {"Authorization": f"Bearer {k8s_session.gateway.key}"},
        {"x-api-key": k8s_session.gateway.key},
    ):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 200
    text = response.text
    assert 'keraunos_controller_attempts_ended_total{outcome="failed"}' in text
    assert "keraunos_controller_attempts_started_total" in text
    assert 'keraunos_controller_attempts_start_failed_total{cause="refused"}' in text
    assert "keraunos_controller_pool_size 100.0" in text


def test_a_controller_with_metrics_public_serves_them_without_the_key(
    k8s_session: K8sEnv, tmp_path: Path
) -> None:
    port = free_port()
    started = start_controller(
        k8s_session,
        "public-metrics",
        "--metrics-port",
        str(port),
        "--metrics-public",
        "true",
        instance="public",
    )
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert response.status_code == 200 and "keraunos_controller_loop_errors_total" in response.text
    finally:
        started.stop()
