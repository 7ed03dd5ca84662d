"""One attempt's Job from a rollout's template: render, parse, check, force — pure functions.

The template is Jinja2, rendered in a sandbox with two variables, `job_name` and `input` (the
rollout's input), and one filter, `yaml_escape`, which writes any value as a YAML double-quoted
string (strings as they are, other values JSON-encoded, every character that could end the scalar
or the document escaped), so a value passed through it stays data whatever it holds. A value put
into the template without the filter is pasted as it is: that is the template author's risk.

The result must be exactly one YAML document of kind Job. The runner then forces what PROTOCOL.md
fixes: name, namespace, labels (`app.kubernetes.io/managed-by`, the controller instance, rollout
and attempt id), the exact ids as annotations, `backoffLimit: 0`, `restartPolicy: Never`,
`ttlSecondsAfterFinished`, `activeDeadlineSeconds` = the attempt timeout, and the agent
environment contract (`AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`) in every container.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from keraunos.controller.runners._k8s_names import label_value

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "keraunos"
INSTANCE_LABEL = "keraunos.dev/instance"
ROLLOUT_KEY = "keraunos.dev/rollout-id"
ATTEMPT_KEY = "keraunos.dev/attempt-id"
#: The variables every container gets; a template's own values for them are replaced.
CONTRACT_VARIABLES = ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY")


class TemplateError(ValueError):
    """The job template cannot make this attempt's Job; the message says why (the attempt's reason)."""


@dataclass(frozen=True)
class JobSettings:
    """What the runner forces on every Job, beside the attempt's own name, ids and environment."""

    namespace: str
    instance: str
    ttl_s: int


def selector(instance: str) -> str:
    """The label selector of every Job one controller instance manages."""
    return f"{MANAGED_BY_LABEL}={MANAGED_BY},{INSTANCE_LABEL}={label_value(instance)}"


def attempt_of(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (rollout id, attempt id) a Job was made for, from its annotations; None if it has none."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    rollout_id, attempt_id = annotations.get(ROLLOUT_KEY), annotations.get(ATTEMPT_KEY)
    if isinstance(rollout_id, str) and isinstance(attempt_id, str):
        return rollout_id, attempt_id
    return None


# -- yaml_escape ------------------------------------------------------------------------------------

_NAMED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def yaml_escape(value: Any) -> str:
    """`value` as a YAML double-quoted scalar that loads back as a string: a string as it is,
    anything else JSON-encoded. Everything outside printable ASCII is escaped, so no value can end
    the scalar, start a new line, key, comment or document, or reach a template expression."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["yaml_escape"] = yaml_escape
    return env


def render_document(template: str, *, job_name: str, rollout_input: Any) -> dict[str, Any]:
    """Render `template` and parse it; the one Job document it makes. Raises `TemplateError`."""
    try:
        text = _environment().from_string(template).render(job_name=job_name, input=rollout_input)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"job template: syntax error on line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:  # undefined variables, sandbox refusals (SecurityError)
        raise TemplateError(f"job template: {exc.message or type(exc).__name__}") from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise TemplateError(f"job template: the rendered text is not valid YAML: {first}") from None
    if len(documents) != 1:
        raise TemplateError(
            f"job template: renders {len(documents)} YAML documents; it must render exactly one Job"
        )
    (job,) = documents
    if not isinstance(job, dict):
        raise TemplateError(f"job template: renders a {type(job).__name__}, not a Kubernetes Job mapping")
    if job.get("kind") != "Job":
        raise TemplateError(f"job template: renders kind {job.get('kind')!r}; it must render a Job")
    if job.setdefault("apiVersion", "batch/v1") != "batch/v1":
        raise TemplateError(f"job template: apiVersion {job['apiVersion']!r}; a Job must be batch/v1")
    return job


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise TemplateError(f"job template: {where} must be a mapping, not {type(value).__name__}")
    return value


def force_fields(
    job: dict[str, Any],
    *,
    name: str,
    rollout_id: str,
    attempt_id: str,
    timeout_s: float,
    env: Mapping[str, str],
    settings: JobSettings,
) -> dict[str, Any]:
    """Set what the runner owns on a parsed Job (in place; returned for convenience). Raises
    `TemplateError` when the template's shape leaves no container to run."""
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        INSTANCE_LABEL: label_value(settings.instance),
        ROLLOUT_KEY: label_value(rollout_id),
        ATTEMPT_KEY: label_value(attempt_id),
    }
    metadata = _mapping(job, "metadata", "metadata")
    metadata.pop("generateName", None)
    metadata["name"] = name
    metadata["namespace"] = settings.namespace
    _mapping(metadata, "labels", "metadata.labels").update(labels)
    _mapping(metadata, "annotations", "metadata.annotations").update(
        {ROLLOUT_KEY: rollout_id, ATTEMPT_KEY: attempt_id}
    )
    spec = _mapping(job, "spec", "spec")
    spec["backoffLimit"] = 0
    spec["ttlSecondsAfterFinished"] = settings.ttl_s
    spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout_s))
    template = _mapping(spec, "template", "spec.template")
    _mapping(
        _mapping(template, "metadata", "spec.template.metadata"), "labels", "spec.template.metadata.labels"
    ).update(labels)
    pod = _mapping(template, "spec", "spec.template.spec")
    pod["restartPolicy"] = "Never"
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise TemplateError("job template: spec.template.spec.containers must be a non-empty list")
    for field in ("initContainers", "containers"):
        for index, container in enumerate(pod.get(field) or []):
            if not isinstance(container, dict):
                raise TemplateError(f"job template: spec.template.spec.{field}[{index}] must be a mapping")
            _inject(container, env, f"spec.template.spec.{field}[{index}]")
    return job


def _inject(container: dict[str, Any], env: Mapping[str, str], where: str) -> None:
    existing = container.get("env") or []
    if not isinstance(existing, list):
        raise TemplateError(f"job template: {where}.env must be a list")
    kept = [e for e in existing if not (isinstance(e, dict) and e.get("name") in CONTRACT_VARIABLES)]
    container["env"] = kept + [{"name": key, "value": value} for key, value in env.items()]


def render_job(
    template: str,
    *,
    name: str,
    rollout_id: str,
    attempt_id: str,
    rollout_input: Any,
    timeout_s: float,
    env: Mapping[str, str],
    settings: JobSettings,
) -> dict[str, Any]:
    """The Job of one attempt: the template rendered with `job_name` and `input`, then forced."""
    job = render_document(template, job_name=name, rollout_input=rollout_input)
    return force_fields(
        job,
        name=name,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        timeout_s=timeout_s,
        env=env,
        settings=settings,
    )
