"""The model and its generation loop: a batch of sequences advanced one token per forward pass.

`ModelRunner` owns the torch model and tokenizer. `generate` runs a batch to completion in the
calling thread (the scheduler calls it from a worker thread): the prompts are left-padded with an
attention mask and explicit position ids, the first forward fills the KV cache, then each step
feeds one token per sequence. Every sampled token is reported at once through the sequence's
`emit` callback, so streams flow while the batch runs. `load_weights` swaps the weights in place
between batches (one lock guards both) and raises the version.

`load_adapter` loads a PEFT LoRA adapter onto the base model under a name (PEFT injects its
matrices into the model's own layers, so generation calls the same model). A sequence names the
adapter it is generated with, or none for the base: a batch runs one group of sequences per
adapter, with that adapter active (the base with every adapter switched off).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import torch

from keraunos.errors import InputError
from keraunos.serving.detokenize import TextTracker
from keraunos.serving.sampling import SamplingParams, draw, json_logprob, sampling_logprobs, top_alternatives

log = structlog.get_logger("keraunos.serving")


class WeightsError(InputError):
    """New weights do not fit the served model (unknown or missing names, other shapes, unreadable files)."""


class ModelLoadError(InputError):
    """The model directory cannot be loaded; the message says what is wrong."""


class AdapterError(InputError):
    """A LoRA adapter cannot be loaded (not a PEFT adapter directory, another base, a bad name)."""


@dataclass(frozen=True)
class LoadedAdapter:
    """A LoRA adapter the runner serves: where it was loaded from, and when (monotonic order)."""

    name: str
    path: str
    loaded: int


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a sequence: its id, log probability, alternatives and the text it adds.

    `finish_reason` is set on the sequence's last token: "stop" (end-of-turn token or a stop
    string, named by `stop_reason`) or "length" (max_tokens or the context length reached).
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    text: str
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass
class SequenceRequest:
    """One sequence to generate and where its tokens go (`emit` is called from the runner's thread)."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    emit: Callable[[TokenEvent], None]
    stop: tuple[str, ...] = ()
    generator: torch.Generator | None = None
    adapter: str | None = None
    generated: list[int] = field(default_factory=list)


class ModelRunner:
    """A causal LM and tokenizer on one device, generating batches and taking new weights."""

    def __init__(
        self, model: Any, tokenizer: Any, *, max_model_len: int = 0, seed: int = 0, max_adapters: int = 4
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        config = model.config
        self.max_model_len = max_model_len or int(getattr(config, "max_position_embeddings", 2048))
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.version = 0
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = next(
            i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if isinstance(i, int)
        )
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        parameters = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; older releases know only the former.
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._keep_arg = "logits_to_keep" if "logits_to_keep" in parameters else None
        self._token_text: dict[int, str] = {}
        self.max_adapters = max_adapters
        self.adapters: dict[str, LoadedAdapter] = {}
        self._peft: Any = None  # the PeftModel around `model`, once an adapter is loaded
        self._loads = 0

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int = 0,
        seed: int = 0,
        max_adapters: int = 4,
    ) -> ModelRunner:
        """Load a causal LM and its tokenizer from a local directory (never from the network)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} holds no model (no config.json); use --tiny to build a tiny one there"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model: Any = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype), local_files_only=True
            )
            model = model.to(device)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the model in {path}: {exc}") from None
        if tokenizer.chat_template is None:
            log.warning(
                "the tokenizer has no chat template; chat/completions will answer 400", model=str(path)
            )
        return cls(model, tokenizer, max_model_len=max_model_len, seed=seed, max_adapters=max_adapters)

    # -- generation --------------------------------------------------------------------------------

    def generate(self, sequences: list[SequenceRequest]) -> None:
        """Generate every sequence to its end, emitting each token as it is sampled."""
        if not sequences:
            return
        groups: dict[str | None, list[SequenceRequest]] = {}
        for sequence in sequences:
            groups.setdefault(sequence.adapter, []).append(sequence)
        gone: AdapterError | None = None
        with self._lock, torch.inference_mode():
            for adapter, group in groups.items():
                try:
                    with self._adapter_active(adapter):
                        self._generate(group)
                except AdapterError as exc:  # unloaded since the request came: fail its group only
                    gone = exc
        if gone is not None:
            raise gone

    @contextlib.contextmanager
    def _adapter_active(self, adapter: str | None) -> Iterator[None]:
        """The model with `adapter` active, or (None) the base with every adapter off."""
        if self._peft is None:
            if adapter is not None:
                raise AdapterError(f"no LoRA adapter {adapter!r} is loaded")
            yield
        elif adapter is None:
            with self._peft.disable_adapter():
                yield
        else:
            if adapter not in self.adapters:
                raise AdapterError(f"the LoRA adapter {adapter!r} is no longer loaded")
            self._peft.set_adapter(adapter)
            yield

    def _generate(self, sequences: list[SequenceRequest]) -> None:
        batch = len(sequences)
        longest = max(len(s.prompt) for s in sequences)
        ids = torch.full((batch, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, longest), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, longest - len(sequence.prompt) :] = torch.tensor(sequence.prompt)
            mask[row, longest - len(sequence.prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        temperatures = torch.tensor([s.params.temperature for s in sequences], device=self.device)
        top_ps = torch.tensor([s.params.top_p for s in sequences], device=self.device)
        generators = [s.generator or self._generator for s in sequences]
        trackers = [TextTracker(self.tokenizer, s.stop) for s in sequences]
        active = [True] * batch
        cache = None
        extra = {self._keep_arg: 1} if self._keep_arg else {}
        while any(active):
            output = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: cache},
                **extra,
            )
            cache = getattr(output, self._cache_arg, None)
            if cache is None:
                cache = output.past_key_values
            logprobs = sampling_logprobs(output.logits[:, -1, :], temperatures, top_ps).cpu()
            rows = [row for row in range(batch) if active[row]]
            drawn = draw(
                logprobs[rows], [sequences[r].params.temperature for r in rows], [generators[r] for r in rows]
            )
            next_ids = [self.pad_id] * batch
            for row, token in zip(rows, drawn, strict=True):
                next_ids[row] = token
                active[row] = self._advance(sequences[row], trackers[row], logprobs[row], token)
            ids = torch.tensor(next_ids, device=self.device)[:, None]
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1

    def _advance(
        self, sequence: SequenceRequest, tracker: TextTracker, logprobs: torch.Tensor, token: int
    ) -> bool:
        """Record `token` for `sequence` and emit it; False when the sequence has ended."""
        sequence.generated.append(token)
        stop_string = tracker.update(sequence.generated)
        finish = stop_reason = None
        if token in self.eos_ids:
            finish = "stop"
        elif stop_string is not None:
            finish, stop_reason = "stop", stop_string
        elif len(sequence.generated) >= min(sequence.max_tokens, self.max_model_len - len(sequence.prompt)):
            finish = "length"
        sequence.emit(
            TokenEvent(
                token_id=token,
                logprob=json_logprob(float(logprobs[token])),
                top=top_alternatives(logprobs, sequence.params.top_logprobs),
                text=tracker.delta(final=finish is not None),
                finish_reason=finish,
                stop_reason=stop_reason,
            )
        )
        return finish is None

    def token_text(self, token: int) -> str:
        """The text of one token as logprobs show it (special tokens included)."""
        text = self._token_text.get(token)
        if text is None:
            text = self._token_text[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    # -- weights -----------------------------------------------------------------------------------

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | str | Path, *, version: int | None = None
    ) -> int:
        """Copy new weights into the model in place, between batches; returns the new version.

        `weights` is a state dict (e.g. the trainer's `model.state_dict()`) or a directory of
        `*.safetensors` files. Names must be the model's own; names missing because they are tied
        to another weight (a tied `lm_head`) may be left out. The version becomes `version`, or
        goes up by one. Raises `WeightsError` (nothing changed) when they do not fit.
        """
        if self._peft is not None:
            raise WeightsError(
                "LoRA adapters are loaded on this server: it serves a fixed base with adapters, not "
                "full weight swaps (restart it to swap full weights)"
            )
        state = _read_safetensors(Path(weights)) if isinstance(weights, str | Path) else dict(weights)
        own = self.model.state_dict()
        unexpected = sorted(set(state) - set(own))
        if unexpected:
            raise WeightsError(
                f"{len(unexpected)} weight names the model does not have, e.g. {unexpected[0]!r}"
            )
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise WeightsError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(own[name].shape)}"
                )
        given = {own[name].data_ptr() for name in state}
        missing = sorted(name for name in set(own) - set(state) if own[name].data_ptr() not in given)
        if missing:
            raise WeightsError(f"{len(missing)} weights missing, e.g. {missing[0]!r}")
        with self._lock, torch.no_grad():
            self.model.load_state_dict(state, strict=False)
            self.version = self.version + 1 if version is None else version
        log.info("weights loaded", version=self.version, tensors=len(state))
        return self.version

    def load_adapter(self, name: str, path: str | Path) -> LoadedAdapter:
        """Load the PEFT LoRA adapter saved in `path` as `name`, between batches.

        A name loaded already is replaced (an adapter is immutable once loaded otherwise: the
        trainer publishes each version under a new name). Beyond `max_adapters` the adapter loaded
        longest ago is unloaded. Raises `AdapterError` (nothing changed) when `path` is no adapter
        of this model.
        """
        from peft import PeftModel

        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise AdapterError(f"{path} holds no PEFT adapter (no adapter_config.json)")
        with self._lock, torch.no_grad():
            try:
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
                else:
                    if name in self.adapters:
                        self._peft.delete_adapter(name)
                        del self.adapters[name]
                    self._peft.load_adapter(str(path), adapter_name=name)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                raise AdapterError(f"cannot load the LoRA adapter in {path}: {exc}") from None
            self._peft.eval()
            self._loads += 1
            loaded = self.adapters[name] = LoadedAdapter(name, str(path), self._loads)
            while len(self.adapters) > self.max_adapters:
                oldest = min(self.adapters.values(), key=lambda a: a.loaded)
                self._peft.delete_adapter(oldest.name)
                del self.adapters[oldest.name]
                log.info("adapter unloaded", adapter=oldest.name)
        log.info("adapter loaded", adapter=name, path=str(path))
        return loaded


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise WeightsError(f"no .safetensors files at {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except (OSError, SafetensorError) as exc:
            raise WeightsError(f"cannot read {file}: {exc}") from None
    return state


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for value in (getattr(generation, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)
