"""Hostile job templates and inputs: every one ends in a Job or a `TemplateError` with the reason,
nothing YAML-only reaches the API, aliases cannot amplify, and data never expands as `$(VAR)`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_standin._containers import container_argv, container_environment, expand

from keraunos.controller.runners._k8s_render import (
    DEFAULT_MAX_JOB_BYTES,
    JobSettings,
    TemplateError,
    escape_expansion,
    render_job,
)

SETTINGS = JobSettings(namespace="agents", instance="main", ttl_s=600)
ENV = {"AGL_OPENAI_BASE_URL": "http://gw/proxy/x", "AGL_EVENT_URL": "http://gw/e", "AGL_KEY": "secret-token"}


def job_with(container_body: str) -> str:
    return (
        "kind: Job\nspec:\n  template:\n    spec:\n      containers:\n"
        "        - name: agent\n          image: x\n          command: [run]\n" + container_body
    )


def render(template: str, rollout_input: Any = None, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": "kr-r-0123abcd",
        "rollout_id": "r",
        "attempt_id": "1",
        "rollout_input": rollout_input,
        "timeout_s": 60,
        "env": ENV,
        "settings": SETTINGS,
    }
    return render_job(template, **(args | overrides))


def container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("template", "rollout_input", "reason"),
    [
        ("{{ input.question + 1 }}", {"question": "a string"}, "TypeError"),
        ("{{ 1/0 }}", None, "ZeroDivisionError"),
        ("{{ input | length }}", 7, "TypeError"),
        ("{{ input.n | int // 0 }}", {"n": "3"}, "ZeroDivisionError"),
        ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", None, "recursion"),
        ("{% for i in range(10**12) %}x{% endfor %}", None, "range()"),
        ("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", None, "range()"),
        ("{{ 'x' * 10**9 }}", None, "'*'"),
        ("{{ [1] * 10**9 }}", None, "'*'"),
        ("{{ 7 ** 100000 }}", None, "'**'"),
        ("{% for i in range(90000) %}{{ 'y' * 100 }}{% endfor %}", None, "renders more than"),
        ("{{ input.missing }}", {}, "job template"),
        ("{{ '[' * 200000 }}", None, "nested too deeply"),
        ("{% for _ in range(10) %}[{% endfor %}", None, "not valid YAML"),
        (job_with("          env: {{ input }}\n"), {"a": 1}, "must be a list"),
        ("kind: Job\nspec: [1, 2]\n", None, "spec must be a mapping"),
    ],
)
def test_a_template_that_raises_any_error_fails_with_a_template_error_that_says_why(
    template: str, rollout_input: Any, reason: str
) -> None:
    with pytest.raises(TemplateError) as raised:
        render(template, rollout_input)
    assert str(raised.value).startswith("job template:") and reason in str(raised.value)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("2024-05-01", "a date (2024-05-01)"),
        ("2024-05-01T10:00:00Z", "a timestamp"),
        ("!!binary aGVsbG8=", "binary (!!binary)"),
        ("!!set {a, b}", "a set (!!set)"),
        (".nan", "nan"),
        ("-.inf", "-inf"),
    ],
)
def test_a_value_yaml_reads_as_no_json_value_fails_the_attempt_naming_its_field(
    value: str, reason: str
) -> None:
    template = job_with("          env:\n            - name: DAY\n              value: {{ input.day }}\n")
    with pytest.raises(TemplateError) as raised:
        render(template, {"day": value})
    message = str(raised.value)
    assert "spec.template.spec.containers[0].env[0].value" in message and reason in message


def test_a_non_string_key_fails_the_attempt() -> None:
    with pytest.raises(TemplateError, match="key that YAML read as a int"):
        render(job_with("          1: x\n"))


@pytest.mark.parametrize(
    "template",
    [
        # 389 bytes of nested aliases made a 450 KiB body before.
        "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        + job_with("          args: [*c, *c, *c]\n"),
        job_with(
            "          env: &e [{name: A, value: b}]\n        - name: b\n          image: x\n          env: *e\n"
        ),
        job_with("          <<: &m {image: y}\n        - <<: *m\n          name: b\n"),
        "kind: Job\nspec: &s {template: {spec: {containers: [{name: a, x: *s}]}}}\n",  # a recursive alias
    ],
)
def test_yaml_aliases_are_refused_so_a_small_template_cannot_expand(template: str) -> None:
    with pytest.raises(TemplateError, match="aliases are refused"):
        render(template)


def test_a_job_over_the_size_limit_is_refused_and_the_limit_is_a_setting() -> None:
    template = job_with("          args: [{{ input | yaml_escape }}]\n")
    big = "z" * 5000
    assert container(render(template, big))["args"] == [big]
    with pytest.raises(TemplateError, match="more than 4096"):
        render(template, big, settings=JobSettings("agents", "main", 600, max_bytes=4096))
    assert DEFAULT_MAX_JOB_BYTES == 256 * 1024


#: Data that Kubernetes would expand if it reached an expanding field as it is.
DOLLARS = ["$(AGL_KEY)", "$$(AGL_KEY)", "$", "$$", "a$(HOME)b$", "$($(X))", "$(", "$)AGL_KEY(", "\ue000$(A)"]


@pytest.mark.parametrize("data", DOLLARS)
def test_data_in_env_values_command_and_args_reaches_the_container_literally(data: str) -> None:
    template = (
        "kind: Job\nspec:\n  template:\n    spec:\n      containers:\n        - name: agent\n          image: x\n"
        "          command: [run, {{ input | yaml_escape }}]\n"
        '          args: ["--q={{ input }}", {{ input | yaml_escape }}]\n'
        "          env:\n            - {name: Q, value: {{ input | yaml_escape }}}\n"
    )
    job = render(template, data)
    spec = container(job)
    pod = {"metadata": {"name": "p"}, "spec": job["spec"]["template"]["spec"]}
    env = container_environment(pod, spec)
    assert env["Q"] == data and env["AGL_KEY"] == "secret-token"
    assert container_argv(spec, env) == ["run", data, f"--q={data}", data]


def test_a_reference_the_template_author_wrote_still_expands_beside_data() -> None:
    template = job_with(
        '          args: ["$(AGL_KEY)/{{ input }}", "$$(kept)"]\n'
        '          env:\n            - {name: A, value: "x"}\n            - {name: B, value: "$(A)-{{ input }}"}\n'
    )
    job = render(template, "$(A)")
    spec = container(job)
    pod = {"metadata": {"name": "p"}, "spec": job["spec"]["template"]["spec"]}
    env = container_environment(pod, spec)
    assert env["B"] == "x-$(A)"  # the author's $(A) expanded, the input's did not
    assert container_argv(spec, env)[1:] == ["secret-token/$(A)", "$(kept)"]


def test_the_controllers_own_values_are_escaped_as_data() -> None:
    job = render(job_with(""), env={**ENV, "AGL_EVENT_URL": "http://gw/api/rollouts/$(AGL_KEY)/e"})
    env = {e["name"]: e["value"] for e in container(job)["env"]}
    assert expand(env["AGL_EVENT_URL"], {"AGL_KEY": "secret"}) == "http://gw/api/rollouts/$(AGL_KEY)/e"


@given(st.text())
def test_escaping_is_what_kubernetes_expansion_undoes_for_any_text(text: str) -> None:
    assert expand(escape_expansion(text), {"A": "no", "AGL_KEY": "no"}) == text


_pieces = st.sampled_from(
    [
        "{{ input }}",
        "{{ input | yaml_escape }}",
        "{{ input.a }}",
        "{{ input | length }}",
        "{{ input + 1 }}",
        "{{ 1 / input }}",
        "{% for i in range(input | int) %}- {{ i }}\n{% endfor %}",
        "{% if input %}x{% endif %}",
        "&a [1]",
        "*a",
        "!!binary",
        "!!set",
        "\n  ",
        "\n- ",
        ": ",
        "[",
        "]",
        "{",
        "$(AGL_KEY)",
        "2024-05-01",
        "---\n",
    ]
)
_inputs = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)


@given(st.lists(_pieces, max_size=12), _inputs, st.booleans())
@settings(max_examples=150, deadline=None)
def test_any_template_and_input_end_in_a_json_job_or_a_template_error(
    pieces: list[str], value: Any, in_a_job: bool
) -> None:
    text = "".join(pieces)
    template = job_with(f"          args: [{text}]\n") if in_a_job else text
    try:
        job = render(template, value)
    except TemplateError as exc:
        assert str(exc).startswith("job template:")
        return
    assert job["kind"] == "Job"
    json.dumps(job, allow_nan=False)  # what the API gets is plain JSON
