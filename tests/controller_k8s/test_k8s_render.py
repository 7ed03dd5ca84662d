"""Rendering a rollout's job template into its attempt's Job: forced fields, escaping, the sandbox."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kube_standin._containers import container_environment

from keraunos.controller.runners._k8s_render import (
    JobSettings,
    TemplateError,
    attempt_of,
    render_job,
    yaml_escape,
)

SETTINGS = JobSettings(namespace="agents", instance="trainer-a", ttl_s=600)
ENV = {"AGL_OPENAI_BASE_URL": "http://gw/proxy/x", "AGL_EVENT_URL": "http://gw/api/e", "AGL_KEY": "tok"}

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  name: chosen-by-the-author
  namespace: somewhere-else
  labels: {team: rl}
spec:
  backoffLimit: 6
  ttlSecondsAfterFinished: 5
  activeDeadlineSeconds: 99999
  template:
    spec:
      restartPolicy: OnFailure
      initContainers:
        - name: fetch
          image: busybox
      containers:
        - name: agent
          image: example/agent:1
          args: ["--job", "{{ job_name }}"]
          env:
            - {name: QUESTION, value: {{ input.question | yaml_escape }}}
            - {name: AGL_KEY, value: "the author's own key"}
        - name: sidecar
          image: example/sidecar:1
"""


def render(template: str = TEMPLATE, rollout_input: Any = None, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": "kr-r1-0123abcd",
        "rollout_id": "r:1",
        "attempt_id": "2",
        "rollout_input": {"question": "2+2?"} if rollout_input is None else rollout_input,
        "timeout_s": 120.5,
        "env": ENV,
        "settings": SETTINGS,
    }
    return render_job(template, **(args | overrides))


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def seen_env(job: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's variables as its process gets them, `$(VAR)` expanded as Kubernetes does."""
    pod = {"metadata": {"name": "pod-1"}, "spec": job["spec"]["template"]["spec"]}
    return container_environment(pod, container)


def test_the_runner_forces_name_namespace_labels_retries_restarts_ttl_and_deadline() -> None:
    job = render()
    meta, spec = job["metadata"], job["spec"]
    assert (meta["name"], meta["namespace"]) == ("kr-r1-0123abcd", "agents")
    assert meta["labels"] == {
        "team": "rl",
        "app.kubernetes.io/managed-by": "keraunos",
        "keraunos.dev/instance": "trainer-a",
        "keraunos.dev/rollout-id": meta["labels"]["keraunos.dev/rollout-id"],
        "keraunos.dev/attempt-id": "2",
    }
    assert meta["labels"]["keraunos.dev/rollout-id"].startswith("r-1-")  # ':' cannot be in a label value
    assert attempt_of(job) == ("r:1", "2")  # the exact ids are annotations
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"], spec["activeDeadlineSeconds"]) == (
        0,
        600,
        121,
    )
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["template"]["metadata"]["labels"]["keraunos.dev/attempt-id"] == "2"
    assert spec["template"]["spec"]["containers"][0]["args"] == ["--job", "kr-r1-0123abcd"]


def test_every_container_gets_the_environment_contract_and_keeps_its_other_variables() -> None:
    pod = render()["spec"]["template"]["spec"]
    agent, sidecar = pod["containers"]
    assert env_of(agent) == {"QUESTION": "2+2?", **ENV}  # the template's AGL_KEY is replaced
    assert [e["name"] for e in agent["env"]].count("AGL_KEY") == 1
    assert env_of(sidecar) == ENV
    assert env_of(pod["initContainers"][0]) == ENV


NASTY = [
    "she said \"hi\" and 'bye'",
    "line one\nline two\n  indented: true",
    "{{ job_name }} {% if true %}x{% endif %}",
    "---\nkind: ConfigMap",
    "...",
    "key: value",
    "# not a comment",
    "- list item",
    "&anchor *alias !!python/object:os.system",
    "tab\there, cr\r, nul\0, bell\a, esc\x1b",
    "unicode é ü 漢字 🙂, line separators \u2028\u2029\x85, bom \ufeff",
    "   leading and trailing spaces   ",
    "",
    "null",
    "true",
    "0x1F",
    "\\backslash\\",
    '"',
]


@pytest.mark.parametrize("value", NASTY)
def test_a_value_through_yaml_escape_stays_one_string_whatever_it_holds(value: str) -> None:
    job = render(rollout_input={"question": value})
    assert env_of(job["spec"]["template"]["spec"]["containers"][0])["QUESTION"] == value
    assert job["kind"] == "Job" and job["metadata"]["name"] == "kr-r1-0123abcd"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=8,
)


@given(json_values)
def test_yaml_escape_round_trips_any_json_value_in_block_and_flow_positions(value: Any) -> None:
    expected = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    escaped = yaml_escape(value)
    assert "\n" not in escaped
    assert yaml.safe_load(f"value: {escaped}\nafter: 1\n") == {"value": expected, "after": 1}
    assert yaml.safe_load(f"- {escaped}\n- [{escaped}, {escaped}]\n") == [expected, [expected, expected]]


@given(st.text())
def test_any_text_through_yaml_escape_leaves_the_job_exactly_as_templated(text: str) -> None:
    job = render(rollout_input={"question": text})
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert seen_env(job, container)["QUESTION"] == text  # `$(` included: it is data
    assert list(job) == ["apiVersion", "kind", "metadata", "spec"]
    assert len(job["spec"]["template"]["spec"]["containers"]) == 2


def test_non_string_values_are_passed_as_their_json() -> None:
    job = render(rollout_input={"question": {"a": [1, 2.5, None, True], "b": "ü"}})
    assert json.loads(env_of(job["spec"]["template"]["spec"]["containers"][0])["QUESTION"]) == {
        "a": [1, 2.5, None, True],
        "b": "ü",
    }


def test_an_input_field_without_yaml_escape_is_pasted_as_it_is_which_is_the_authors_risk() -> None:
    unescaped = TEMPLATE.replace("{{ input.question | yaml_escape }}", "{{ input.question }}")
    with pytest.raises(TemplateError):
        render(unescaped, rollout_input={"question": "x}\n  - {name: EVIL"})


@pytest.mark.parametrize(
    "expression",
    [
        "input.__class__.__mro__",
        "job_name.__class__.__mro__[1].__subclasses__()",
        "input.items.__self__.__class__",
        "job_name.format.__globals__",
        "cycler.__init__.__globals__",
        "lipsum.__globals__['os']",
        "input.__class__",
    ],
)
def test_the_sandbox_refuses_python_internals(expression: str) -> None:
    template = TEMPLATE.replace("{{ job_name }}", "{{ " + expression + " }}")
    with pytest.raises(TemplateError, match=r"unsafe|undefined|no attribute"):
        render(template)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("", "renders 0 YAML documents"),
        ("# just a comment\n", "renders 0 YAML documents"),
        (TEMPLATE + "\n---\n" + TEMPLATE, "renders 2 YAML documents"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "renders kind 'ConfigMap'"),
        ("- kind: Job\n", "renders a list"),
        ("apiVersion: batch/v2\nkind: Job\n", "batch/v1"),
        ("kind: Job\nspec: {template: {spec: {containers: []}}}\n", "containers must be a non-empty list"),
        ("kind: Job\nspec: [1]\n", "spec must be a mapping"),
        ("kind: Job\n  bad: : indentation\n", "not valid YAML"),
        ("kind: Job\nname: {{ job_name\n", "syntax error on line 2"),
        ("kind: Job\nname: {{ input.nope }}\n", "nope"),
        ("kind: Job\nname: {{ nothing }}\n", "'nothing' is undefined"),
    ],
)
def test_a_template_that_cannot_make_exactly_one_job_fails_with_a_clear_message(
    template: str, message: str
) -> None:
    with pytest.raises(TemplateError, match=message) as failure:
        render(template)
    assert str(failure.value).startswith("job template: ")


def test_a_template_may_leave_out_api_version_metadata_and_restart_policy() -> None:
    job = render("kind: Job\nspec:\n  template:\n    spec:\n      containers: [{name: a, image: b}]\n")
    assert job["apiVersion"] == "batch/v1"
    assert job["metadata"]["name"] == "kr-r1-0123abcd"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
