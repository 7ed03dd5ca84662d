"""Publishing a run's checkpoints as versions of a `weights` resource (docs/training-loop.md "Publishing").

With `publish_resource` set, every checkpoint the run writes (the final one included) is pushed to
the gateway the run uses as the resource's next version: where the checkpoint is, the name and
weights version the engines serve it under, and for LoRA the base model the adapter applies to;
then `publish_label` (say `candidate`) is moved to it. A release (`keraunos release start`) takes
it from there: a run never moves a protected label such as `production` itself.

A push the gateway refuses or cannot take is logged and recorded as a failure, never raised: the
checkpoint is on disk, and training goes on. Pushes are idempotent by content (the gateway answers
`created: false` for content equal to the latest version's), so a resumed run that pushes its
restored checkpoint again stores nothing twice. Every attempt is a line of `RUN_DIR/published.jsonl`
(`{"step", "version", "created"}` or `{"step", "error"}`), which the summary reads.

With `release_label` (say `production`), the run ends by starting a release of its final
checkpoint's version on that label (`POST /api/releases`, the plan built from the `release_*`
fields as `keraunos release start` builds it); `keraunos release run` drives it from there. The
release's id is made of the run's id and the version, so a resumed run that finishes with the same
version finds the release an earlier invocation started and starts no second one. Nothing to
release (the final checkpoint was not published, the label points at its version already) and a
refusal (the key, a live release holding the label, the gateway gone) are logged and go to the
summary, never raised: the run succeeded and its checkpoints are on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import structlog

from keraunos.controller._urls import path_segment
from keraunos.gateway.config import GatewayConfig
from keraunos.release.start_once import detail as _detail
from keraunos.release.start_once import release_id_of, skipped, start_release_once
from keraunos.resources import LabelMove, PushResult, ResourcePush, WeightsContent
from keraunos.training.errors import TrainError
from keraunos.training.train_config import TrainConfig

log = structlog.get_logger("keraunos.training.publish")

#: The labels an embedded gateway protects (its default): only a release or an approver moves them.
EMBEDDED_PROTECTED_LABELS: frozenset[str] = frozenset(
    GatewayConfig.model_fields["protected_labels"].default or ()
)

#: A version number no resource reaches: a label move to it is refused after the key's role is
#: checked and before anything changes (404), which is what the start-up probe needs.
_NO_VERSION = 2**62


def weights_content(config: TrainConfig, checkpoint: Path, model_version: int) -> WeightsContent:
    """What one checkpoint's version holds: its absolute path, the served model name, the weights
    version the engines serve after the update it follows, and for LoRA the base model directory."""
    lora = config.lora_rank > 0
    return WeightsContent(
        location=str(checkpoint.resolve()),
        model=config.served_model_name,
        model_version=model_version,
        adapter=lora,
        base=str(Path(config.model).resolve()) if lora else None,
    )


@dataclass(frozen=True, slots=True)
class Published:
    """One attempt to publish a checkpoint: the version it became (None: the push failed), and
    what went wrong (None: nothing; with a version: the label move failed)."""

    step: int
    version: int | None = None
    created: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The line of `published.jsonl` (and the item of the summary's lists)."""
        line: dict[str, Any] = {"step": self.step}
        if self.version is not None:
            line.update(version=self.version, created=self.created)
        if self.error is not None:
            line["error"] = self.error
        return line


class CheckpointPublisher:
    """Pushes checkpoints to one weights resource through the run's gateway, with the run's key."""

    def __init__(
        self,
        config: TrainConfig,
        gateway: str,
        key: str,
        run_id: str,
        run_dir: Path,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.config = config
        self.resource = config.publish_resource
        self.label = config.publish_label
        self.release_label = config.release_label
        self.run_id = run_id
        self.path = run_dir / "published.jsonl"
        self._client = httpx.AsyncClient(base_url=gateway, headers=headers, timeout=timeout_s)

    async def close(self) -> None:
        await self._client.aclose()

    async def check_label(self) -> None:
        """Refuse, before any training, a `publish_label` that only a release may move.

        An embedded gateway protects its default labels (`production`), but the run holds its
        server key, which could move them: refused here by name. Any gateway is asked too, by a
        label move that cannot change anything (to the version the label points at, or to one that
        does not exist): 403 (a protected label, a trainer's key) or 409 (a live release holds
        the label) is the refusal the run would meet at every checkpoint.
        """
        if not self.label:
            return
        if self.label in EMBEDDED_PROTECTED_LABELS:
            raise self._protected(f"'{self.label}' is a protected label")
        path = f"/api/resources/{path_segment(self.resource)}/labels"
        try:
            current = await self._client.get(path)
            version = _NO_VERSION
            if current.status_code == 200:
                version = next(
                    (int(i["version"]) for i in current.json() if i["label"] == self.label), version
                )
            probe = await self._client.put(
                f"{path}/{path_segment(self.label)}", json=LabelMove(version=version).model_dump(mode="json")
            )
        except httpx.HTTPError as exc:
            raise TrainError(f"publish_label {self.label!r}: gateway unreachable: {exc!r}") from None
        if probe.status_code in (403, 409):
            raise self._protected(
                f"the gateway refuses to move it (HTTP {probe.status_code}: {_detail(probe)})"
            )

    async def check_release(self) -> None:
        """Refuse, before any training, a key the gateway would not let start the run's release.

        The probe is `POST /api/releases` with an empty body: the gateway checks the key's role
        before it reads the body, so a key allowed to start releases gets 422 (the body lacks the
        resource) and nothing is created, and any other key gets 403. What only the end can tell
        (a live release holding the label then, the label's baseline) is met at the end.
        """
        if not self.release_label:
            return
        try:
            probe = await self._client.post("/api/releases", json={})
        except httpx.HTTPError as exc:
            raise TrainError(f"release_label {self.release_label!r}: gateway unreachable: {exc!r}") from None
        if probe.status_code == 422:
            return
        if probe.status_code in (401, 403):
            raise TrainError(
                f"release_label {self.release_label!r}: the run's key may not start releases (HTTP "
                f"{probe.status_code}: {_detail(probe)}); use a trainer's or an admin's key, or leave "
                f"release_label empty and start it by hand (keraunos release start {self.resource} ...)"
            )
        raise TrainError(
            f"release_label {self.release_label!r}: the gateway takes no releases (POST /api/releases: "
            f"HTTP {probe.status_code}: {_detail(probe)})"
        )

    async def start_release(self, final_step: int, published: list[dict[str, Any]]) -> dict[str, Any]:
        """Start the release of the version the final checkpoint (after `final_step` steps) became,
        on `release_label`; what happened, as the summary's `release`. Never raises for the
        gateway's answer (a refusal is logged and returned with its `error`)."""
        plan = self.config.release
        if plan is None:  # a caller's mistake: the config has no release_label
            raise ValueError("start_release needs a config with release_label")
        last = published[-1] if published else {}
        if last.get("step") != final_step or "version" not in last:
            why = f"the final checkpoint (step {final_step}) was not published"
            if last.get("step") == final_step and "error" in last:
                why += f": {last['error']}"
            return self._no_release(why, None)
        version = int(last["version"])
        return await start_release_once(
            self._client,
            release_id=release_id_of(self.run_id, version),
            resource=self.resource,
            label=self.release_label,
            candidate=version,
            plan=plan,
        )

    def _no_release(self, why: str, version: int | None) -> dict[str, Any]:
        return skipped({"resource": self.resource, "label": self.release_label, "candidate": version}, why)

    def _protected(self, why: str) -> TrainError:
        return TrainError(
            f"publish_label {self.label!r}: {why}; publish to another label (e.g. candidate) and "
            f"move {self.label!r} with a release (keraunos release start {self.resource} --candidate ...)"
        )

    async def publish(self, step: int, checkpoint: Path, model_version: int) -> Published:
        """Push `checkpoint` (the one after `step` completed steps) and move the label to it; what
        happened, also appended to `published.jsonl`. Never raises for the gateway's answer."""
        push = ResourcePush(
            kind="weights",
            content=weights_content(self.config, checkpoint, model_version).model_dump(
                mode="json", exclude_none=True
            ),
            message=f"step {step} of run {self.run_id}",
        )
        result: PushResult | None = None
        try:
            error, result = await self._push(push)
            if result is not None and self.label:
                error = await self._move_label(result.version.version, step)
        except httpx.HTTPError as exc:
            error = f"gateway unreachable: {exc!r}"
        version = None if result is None else result.version.version
        outcome = Published(step, version, result is not None and result.created, error)
        if error is None:
            log.info(
                "checkpoint published",
                resource=self.resource,
                step=step,
                version=outcome.version,
                created=outcome.created,
                label=self.label or None,
            )
        else:
            log.error(
                "could not publish the checkpoint; it stays on disk and training goes on",
                resource=self.resource,
                step=step,
                checkpoint=str(checkpoint),
                version=version,
                error=error,
            )
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(outcome.to_json()) + "\n")
        return outcome

    async def _push(self, push: ResourcePush) -> tuple[str | None, PushResult | None]:
        """(None, the answer) when the gateway took the push, else (what it answered, None)."""
        path = f"/api/resources/{path_segment(self.resource)}"
        response = await self._client.post(path, json=push.model_dump(mode="json"))
        if response.status_code not in (200, 201):
            return f"POST {path}: HTTP {response.status_code}: {_detail(response)}", None
        return None, PushResult.model_validate(response.json())

    async def _move_label(self, version: int, step: int) -> str | None:
        """None when the label points at `version` now, else what the gateway answered."""
        path = f"/api/resources/{path_segment(self.resource)}/labels/{path_segment(self.label)}"
        move = LabelMove(version=version, reason=f"step {step} of run {self.run_id}")
        response = await self._client.put(path, json=move.model_dump(mode="json"))
        if response.status_code not in (200, 201):
            return f"PUT {path}: HTTP {response.status_code}: {_detail(response)}"
        return None


def read_published(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of `RUN_DIR/published.jsonl`, in order (none when the run published nothing)."""
    path = run_dir / "published.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
