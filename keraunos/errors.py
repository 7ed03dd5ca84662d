"""The one exception tree: every error keraunos raises on purpose derives from `KeraunosError`.

```
KeraunosError                 catch it to handle any keraunos failure; the CLI prints it in one line
├── InputError                (also a ValueError) the caller's input or configuration is wrong:
│   │                         fix it and retry; exit status 2, HTTP 4xx
│   ├── ConfigError           _settings: a bad flag, environment variable or YAML key
│   ├── TemplateError         controller.runners._k8s_render: a Job template that does not render
│   ├── LaunchError           controller.launch: an agent command or entry point that cannot run
│   ├── EnvMapError           controller.environment: a bad environment mapping for agents
│   ├── WarmStartError        controller.runners.warm: a warm worker's agent cannot be imported
│   ├── RequestError          serving.requests: a completion request the model server refuses
│   ├── PromptError           serving.prompts: messages the chat template cannot render
│   ├── WeightsError          serving.runner: weights that do not fit the served model
│   ├── ModelLoadError        serving.runner: a model directory that cannot be loaded
│   ├── AdapterError          serving.runner: a LoRA adapter that cannot be loaded
│   ├── GgufError             serving.gguf: a GGUF file that cannot be converted
│   ├── BatchError            training.backends.torch.batch: rows that do not make a batch
│   ├── ObservationError      release.sequences: a reward, arm or fraction the release statistics cannot take
│   ├── InvalidReleaseCommand release.plan: approve, abort or rollback in a state that does not allow it
│   ├── PlanInputError        release.plan_input: a release plan file, replay file or plan option that makes no plan
│   ├── InvalidResource       resources: resource content that does not fit its kind
│   ├── DatasetError          optimize.run: a dataset file that cannot be read as instances
│   ├── ScorerLoadError       rereward.scorers: a reward function 'module:function' that cannot be loaded
│   ├── UnknownRollouts       rereward.run: rollout ids to re-reward that the gateway does not have
│   ├── OnlineStateError      optimize.online: a run directory of another online run or window length
│   └── OtlpBodyError         gateway._otlp: an OTLP trace export that does not decode (400) or inflates too far (413)
└── (runtime failures)        something failed while running; exit status 1, HTTP 5xx or 503
    ├── LedgerError           ledger.errors: LedgerLocked, LedgerUnavailable, RolloutNotFound,
    │                         InvalidTransition, AttemptNotFound, AttemptConflict,
    │                         ResourceNotFound, ResourceConflict
    ├── CodecError            ledger.codec: a stored record that cannot be decoded
    ├── GatewayError          controller.client: the gateway answered with an error
    ├── GatewayUnreachable    controller.client: the gateway could not be reached
    ├── KubeError             controller.runners._k8s_api: the Kubernetes API refused (KubeForbidden)
    ├── StartupError          controller.main: the controller cannot start
    ├── MetricsServerError    _metrics_http: a metrics port that cannot be served (taken, unknown host)
    ├── ServerDidNotStart     _uvicorn: a server in a background thread did not start
    ├── AgentLoadError        controller._agent_main: an agent's entry point failed to load
    ├── AgentError            agent: NotInRolloutError, EventRejectedError, ResourceReadError (the SDK)
    ├── TrainError            training.errors: a training run cannot go on
    ├── CollectorError        training.collect: rollouts cannot be collected
    ├── TripletReadError      training._read: a triplet answer that cannot be read
    ├── CheckpointError       training.backends.torch.checkpoint: a checkpoint cannot be used
    ├── RankError             training.backends.torch.ranks: a rank of a multi-process trainer died
    ├── ReplicaError          training.backends.external: a replica did not take an update
    ├── PolicyLoadError       training.backends.torch.policy: the policy cannot be loaded
    ├── DemoError             demo.command: the demo cannot run as asked
    ├── ExportError           export.source: the gateway could not be read for an export, or refused a read
    ├── ChatCallError         chat_model: a chat model keraunos asks gave no usable answer (wrapped by the two below)
    ├── ProposerError         optimize.proposer: the optimizer model failed after its retries, or refused a request
    ├── OptimizeGatewayError  optimize.gateway: the gateway refused or failed a call the optimiser needs
    ├── JudgeCallError        rereward.judge: the judge model failed after its retries, or refused a request
    ├── JudgementError        rereward.scorers: a judge's reply that is not the JSON asked for
    └── RerewardGatewayError  rereward.run: the gateway refused or failed a read or post a re-reward needs
```

Exceptions used for control flow inside one module (a watch that must restart, a batch to fail,
an acknowledgement that did not come) and HTTP exceptions of the gateway stay outside the tree:
they never reach a caller. This module imports nothing, so the agent SDK can use it.
"""

from __future__ import annotations


class KeraunosError(Exception):
    """The root of every error keraunos raises on purpose."""


class InputError(KeraunosError, ValueError):
    """The caller's input or configuration is wrong: fixing it, not retrying, is what helps."""


def exit_status(error: KeraunosError) -> int:
    """The CLI's exit status for `error`: 2 for bad input, 1 for a failure while running."""
    return 2 if isinstance(error, InputError) else 1
