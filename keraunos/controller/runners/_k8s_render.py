"""One attempt's Job from a rollout's template: render, parse, check, force — pure functions.

The template is Jinja2, rendered in a sandbox with two variables, `job_name` and `input` (the
rollout's input), and one filter, `yaml_escape`, which writes any value as a YAML double-quoted
string (strings as they are, other values JSON-encoded, every character that could end the scalar
or the document escaped), so a value passed through it stays data whatever it holds. A value put
into the template without the filter is pasted as it is: that is the template author's risk.

Whatever the template and the input hold, rendering ends in a Job or a `TemplateError` whose
message is the attempt's reason, never another exception: the rendered text is capped at
`JobSettings.max_bytes` (checked while it is produced), `range` gives at most `RANGE_BUDGET`
numbers per render over all its calls, `*` and `**` refuse results past the cap, YAML aliases are
refused (a few bytes of anchors can expand into megabytes), and the Job must be plain JSON (a value
YAML reads as a date, `!!binary` or `!!set` is named with its path). Any other error of Jinja or
Python (`1/0`, `"a" + 1`, a recursive macro) becomes a `TemplateError` too.

Kubernetes expands `$(NAME)` in a container's `command`, `args` and `env[].value` (`$$` is a `$`).
There, every `$` that a `{{ ... }}` expression produced (data: the input, the ids) is written `$$`,
so it reaches the container as it is; a `$(NAME)` the template's own text holds is left to expand.
To tell them apart the template is rendered a second time (only when the text holds a `$`) with
every `$` of an expression's output replaced by a private-use character, and the two Jobs are
compared field by field. The text of a macro or a call block comes out of an expression, so it
counts as data there. The controller's own values (`AGL_*`) are escaped the same way.

The result must be exactly one YAML document of kind Job. The runner then forces what
docs/protocol.md#agent-environment
fixes: name, namespace, labels (`app.kubernetes.io/managed-by`, the controller instance, rollout
and attempt id), the exact ids as annotations, `backoffLimit: 0`, `restartPolicy: Never`,
`ttlSecondsAfterFinished`, `activeDeadlineSeconds` = the attempt timeout, and the agent
environment contract (`AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`) in every container.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from keraunos.controller.runners._k8s_names import label_value
from keraunos.errors import InputError

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "keraunos"
INSTANCE_LABEL = "keraunos.dev/instance"
ROLLOUT_KEY = "keraunos.dev/rollout-id"
ATTEMPT_KEY = "keraunos.dev/attempt-id"
#: The variables every container gets; a template's own values for them are replaced.
CONTRACT_VARIABLES = ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY")
#: Default cap on the rendered template text and on the Job's JSON body, in bytes.
DEFAULT_MAX_JOB_BYTES = 256 * 1024
#: Numbers `range` hands out in one render, over all its calls (nested loops included).
RANGE_BUDGET = 100_000
#: Deepest nesting of mappings and lists a Job may have.
MAX_DEPTH = 64
#: Largest exponent `**` computes.
_MAX_EXPONENT = 4096
#: Stands for a `$` an expression produced, in the second render (see the module docstring).
_DATA_DOLLAR = "\ue000"


class TemplateError(InputError):
    """The job template cannot make this attempt's Job; the message says why (the attempt's reason)."""


@dataclass(frozen=True)
class JobSettings:
    """What the runner forces on every Job, beside the attempt's own name, ids and environment."""

    namespace: str
    instance: str
    ttl_s: int
    max_bytes: int = DEFAULT_MAX_JOB_BYTES


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


class _JobSandbox(SandboxedEnvironment):
    """Jinja's sandbox with budgets for one render: `range` numbers, sequence `*`, `**` exponents."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_chars: int, finalize: Callable[[Any], Any] | None = None) -> None:
        super().__init__(
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            finalize=finalize,
        )
        self.max_chars = max_chars
        self.range_left = RANGE_BUDGET
        self.filters["yaml_escape"] = yaml_escape
        self.globals["range"] = self._range

    def _range(self, *args: int) -> range:
        numbers = range(*args)
        try:
            count = len(numbers)
        except OverflowError:
            count = RANGE_BUDGET + 1
        if count > self.range_left:
            raise TemplateError(
                f"job template: range() would give more than {RANGE_BUDGET} numbers in one render"
            )
        self.range_left -= count
        return numbers

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(times, int)
                    and len(seq) * times > self.max_chars
                ):
                    raise TemplateError(
                        f"job template: '*' would make a value longer than {self.max_chars} characters"
                    )
        elif operator == "**" and isinstance(right, int | float) and abs(right) > _MAX_EXPONENT:
            raise TemplateError(f"job template: '**' with an exponent beyond {_MAX_EXPONENT}")
        return super().call_binop(context, operator, left, right)


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (`*name`, `<<: *name`) instead of expanding them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise TemplateError(
                f"job template: the rendered YAML uses the alias *{event.anchor} on line "
                f"{event.start_mark.line + 1}; aliases are refused (they can expand a small template "
                "into a huge Job), write the value out"
            )
        return super().compose_node(parent, index)


def _render_text(
    template: str, max_chars: int, finalize: Callable[[Any], Any] | None, **variables: Any
) -> str:
    """The rendered text, stopped as soon as it passes `max_chars`."""
    try:
        compiled = _JobSandbox(max_chars, finalize).from_string(template)
        chunks: list[str] = []
        size = 0
        for chunk in compiled.generate(**variables):
            size += len(chunk)
            if size > max_chars:
                raise TemplateError(
                    f"job template: renders more than {max_chars} characters (the controller's "
                    "--k8s-max-job-bytes)"
                )
            chunks.append(chunk)
        return "".join(chunks)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"job template: syntax error on line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:  # undefined variables, sandbox refusals (SecurityError)
        raise TemplateError(f"job template: {exc.message or type(exc).__name__}") from None
    except RecursionError:
        raise TemplateError("job template: recursion too deep (a macro that calls itself?)") from None
    except (TemplateError, MemoryError):
        raise
    except Exception as exc:  # 1/0, "a" + 1, int("x"), length of an int: the input does not fit
        raise TemplateError(f"job template: {type(exc).__name__}: {exc}") from None


def _parse(text: str) -> list[Any]:
    try:
        return [doc for doc in yaml.load_all(text, Loader=_NoAliasLoader) if doc is not None]
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise TemplateError(f"job template: the rendered text is not valid YAML: {first}") from None
    except RecursionError:
        raise TemplateError("job template: the rendered YAML is nested too deeply") from None


def _mark_data_dollars(value: Any) -> Any:
    text = value if isinstance(value, str) else str(value)
    return text.replace("$", _DATA_DOLLAR)


def render_document(
    template: str, *, job_name: str, rollout_input: Any, max_bytes: int = DEFAULT_MAX_JOB_BYTES
) -> dict[str, Any]:
    """Render `template` and parse it; the one Job document it makes, with the `$` that data put
    into its containers' `command`, `args` and env values escaped as `$$`. Raises `TemplateError`."""
    variables = {"job_name": job_name, "input": rollout_input}
    text = _render_text(template, max_bytes, None, **variables)
    documents = _parse(text)
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
    if "$" in text:
        marked_documents = _parse(_render_text(template, max_bytes, _mark_data_dollars, **variables))
        if len(marked_documents) == 1 and isinstance(marked_documents[0], dict):
            _escape_expanded(job, marked_documents[0])
        else:  # the two renders differ in shape: every `$` in the expanded fields counts as data
            _escape_expanded(job, {})
    return job


def _containers(job: Any) -> Iterator[tuple[str, Any]]:
    """Each (field, index) container of a parsed Job, as far as its shape has them."""
    pod = _dig(job, "spec", "template", "spec")
    for field in ("initContainers", "containers"):
        items = pod.get(field) if isinstance(pod, dict) else None
        if isinstance(items, list):
            for index, container in enumerate(items):
                yield f"{field}[{index}]", container


def _dig(value: Any, *keys: str | int) -> Any:
    for key in keys:
        if isinstance(key, int):
            value = value[key] if isinstance(value, list) and key < len(value) else None
        else:
            value = value.get(key) if isinstance(value, dict) else None
    return value


def _escape_expanded(job: dict[str, Any], marked: dict[str, Any]) -> None:
    """Write `$$` for each data `$` in the fields Kubernetes expands: where `marked` has the private
    character, the plain render has a `$` that an expression produced."""
    pod = ("spec", "template", "spec")
    for where, container in _containers(job):
        if not isinstance(container, dict):
            continue
        field, index = where.split("[")[0], int(where.split("[")[1].rstrip("]"))
        other = _dig(marked, *pod, field, index)
        for key in ("command", "args"):
            items = container.get(key)
            if isinstance(items, list):
                for position, item in enumerate(items):
                    if isinstance(item, str):
                        items[position] = _escape_data(item, _dig(other, key, position))
        env = container.get("env")
        if isinstance(env, list):
            for position, entry in enumerate(env):
                if isinstance(entry, dict) and isinstance(entry.get("value"), str):
                    entry["value"] = _escape_data(entry["value"], _dig(other, "env", position, "value"))


def _escape_data(plain: str, marked: Any) -> str:
    """`plain` with each `$` that `marked` shows as data doubled; every `$` when the two disagree."""
    if "$" not in plain:
        return plain
    if not isinstance(marked, str) or len(marked) != len(plain):
        return escape_expansion(plain)
    out: list[str] = []
    for mine, theirs in zip(plain, marked, strict=True):
        if mine == "$" and theirs == _DATA_DOLLAR:
            out.append("$$")
        elif mine == theirs:
            out.append(mine)
        else:  # a render that is not the same twice (the random filter): count it all as data
            return escape_expansion(plain)
    return "".join(out)


def escape_expansion(value: str) -> str:
    """`value` as Kubernetes must see it to pass it on literally: every `$` written `$$`."""
    return value.replace("$", "$$")


def check_body(job: Mapping[str, Any], max_bytes: int) -> None:
    """Refuse a Job that is not plain JSON (a value YAML read as a date, bytes, a set, a non-string
    key, NaN), nested deeper than `MAX_DEPTH`, or whose JSON body is over `max_bytes`."""
    stack: list[tuple[Any, str, int]] = [(job, "the Job", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TemplateError(f"job template: {where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TemplateError(
                        f"job template: {where} has a key that YAML read as {_kind(key)} ({key!r}); quote it"
                    )
                stack.append((item, f"{where}.{key}" if depth else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise TemplateError(f"job template: {where} is {value!r}, which JSON cannot carry")
        elif value is not None and not isinstance(value, str | int | float | bool):
            raise TemplateError(
                f"job template: {where} is {_kind(value)} ({_short(value)}), not a JSON value; quote it in "
                "the template or pass it through yaml_escape"
            )
    try:
        size = len(json.dumps(job, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (ValueError, TypeError) as exc:  # a lone surrogate, say
        raise TemplateError(f"job template: the Job cannot be written as JSON: {exc}") from None
    if size > max_bytes:
        raise TemplateError(
            f"job template: the Job is {size} bytes as JSON, more than {max_bytes} (--k8s-max-job-bytes)"
        )


def _kind(value: Any) -> str:
    names = {
        "date": "a date",
        "datetime": "a timestamp",
        "bytes": "binary (!!binary)",
        "set": "a set (!!set)",
    }
    name = type(value).__name__
    return names.get(name, f"a {name}")


def _short(value: Any) -> str:
    text = str(value) if type(value).__name__ in ("date", "datetime") else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    # The controller's values are data to Kubernetes too: a `$(` in an id stays as it is.
    container["env"] = kept + [{"name": key, "value": escape_expansion(value)} for key, value in env.items()]


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
    """The Job of one attempt: the template rendered with `job_name` and `input`, forced, checked.

    Raises `TemplateError` and nothing else: any other failure of a step becomes one, so that the
    attempt fails with it as its reason."""
    try:
        job = render_document(
            template, job_name=name, rollout_input=rollout_input, max_bytes=settings.max_bytes
        )
        force_fields(
            job,
            name=name,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            timeout_s=timeout_s,
            env=env,
            settings=settings,
        )
        check_body(job, settings.max_bytes)
    except (TemplateError, MemoryError):
        raise
    except RecursionError:
        raise TemplateError("job template: the Job is nested too deeply") from None
    except Exception as exc:  # a shape `force_fields` did not foresee (a list where a mapping goes)
        raise TemplateError(f"job template: {type(exc).__name__}: {exc}") from None
    return job
