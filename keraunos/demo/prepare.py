"""The demo's prepared model: built from its recipe once, then reused from a cache directory.

`prepare_model` writes the tiny model (tokenizer trained on the warm-start conversations, random
weights) into a fresh temporary directory beside the cache entry, runs the supervised warm start
there, saves the result and renames the directory into place, so a cache entry is either
complete or absent (an interrupted build leaves only a temporary directory, removed by the next
build). The entry's name is the recipe's hash and the build tag: another recipe, another entry.

The warm start's bytes depend on more than the recipe: float reductions are split by torch's
thread count, and the kernels chosen differ by CPU instruction set and torch release (on the
project's own 2-core machine one thread and two give different `model.safetensors`, run after run,
with equal losses). So the cache does not promise one set of weights per recipe; it promises the
same bytes for the same recipe on the same build tag (`build_tag`: threads, CPU capability, torch
version), which is what the entry's name records.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from keraunos.demo.recipe import Recipe, tokenizer_corpus, warm_start_conversations

log = structlog.get_logger("keraunos.demo.prepare")

#: The variable naming keraunos' cache root (below a `--cache-dir` flag, above the default).
CACHE_ENV = "KERAUNOS_CACHE_DIR"
#: The file that marks a finished cache entry and records how it was made.
RECIPE_FILE = "keraunos-recipe.json"


@dataclass(frozen=True)
class Prepared:
    """A prepared model: where it is, whether this call built it, and the last warm-start loss."""

    path: Path
    built: bool
    seconds: float
    sft_loss: float | None


def cache_root(flag: str, environ: Mapping[str, str]) -> Path:
    """The cache root: the flag, else `$KERAUNOS_CACHE_DIR`, else `~/.cache/keraunos`."""
    if flag:
        return Path(flag).expanduser()
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV]).expanduser()
    return Path("~/.cache/keraunos").expanduser()


def build_tag(torch_threads: int = 0) -> str:
    """What besides the recipe the warm start's weights depend on, as a path-safe name:
    `t{threads}-{cpu capability}-torch{version}`. `torch_threads` 0 means torch's current count."""
    import torch

    threads = torch_threads or torch.get_num_threads()
    capability = torch.backends.cpu.get_cpu_capability().lower()
    version = re.sub(r"[^A-Za-z0-9.]", "_", torch.__version__)
    return f"t{threads}-{capability}-torch{version}"


def entry_dir(root: Path, recipe: Recipe, tag: str) -> Path:
    """Where the model of `recipe`, built under `tag` (`build_tag`), is cached under `root`."""
    return root / "demo" / f"{recipe.digest()}-{tag}"


def is_prepared(path: Path) -> bool:
    """True when `path` is a finished cache entry."""
    return (path / RECIPE_FILE).is_file() and (path / "config.json").is_file()


def prepare_model(
    recipe: Recipe,
    root: Path,
    *,
    torch_threads: int = 0,
    on_step: Callable[[int, float], None] = lambda step, loss: None,
) -> Prepared:
    """The cached model of `recipe` under `root` for this build tag (`build_tag(torch_threads)`),
    built (and warm-started) first if it is not there."""
    target = entry_dir(root, recipe, build_tag(torch_threads))
    if is_prepared(target):
        return Prepared(target, built=False, seconds=0.0, sft_loss=_recorded_loss(target))
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}-*"):  # builds that were interrupted
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        losses = _build(recipe, work, torch_threads=torch_threads, on_step=on_step)
        record = {
            "recipe": recipe.model_dump(),
            "build_tag": target.name.removeprefix(f"{recipe.digest()}-"),
            "sft_final_loss": losses[-1] if losses else None,
        }
        (work / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(work, target)
        except OSError:
            if not is_prepared(target):  # not another run finishing the same entry first
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    log.info("prepared the demo model", path=str(target), seconds=round(seconds, 1))
    return Prepared(target, built=True, seconds=seconds, sft_loss=losses[-1] if losses else None)


def _build(
    recipe: Recipe, work: Path, *, torch_threads: int, on_step: Callable[[int, float], None]
) -> list[float]:
    """Tiny model into `work`, warm-started in place; the warm start's losses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from keraunos.demo.sft import supervised_warm_start
    from keraunos.serving.tiny import build_tiny_model

    transformers_logging.disable_progress_bar()  # the demo's own bar is the one to watch
    if torch_threads:
        torch.set_num_threads(torch_threads)
    conversations = warm_start_conversations(recipe)
    build_tiny_model(
        work,
        seed=recipe.seed,
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        layers=recipe.layers,
        heads=recipe.heads,
        kv_heads=recipe.kv_heads,
        corpus=tokenizer_corpus(conversations, recipe.seed),
        split_digits=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(work)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = AutoModelForCausalLM.from_pretrained(work, dtype=torch.float32)
        losses = supervised_warm_start(
            model,
            tokenizer,
            conversations,
            steps=recipe.sft_steps,
            batch_size=recipe.sft_batch_size,
            lr=recipe.sft_lr,
            seed=recipe.seed,
            on_step=on_step,
        )
    model.save_pretrained(work)
    return losses


def _recorded_loss(path: Path) -> float | None:
    try:
        loss = json.loads((path / RECIPE_FILE).read_text(encoding="utf-8")).get("sft_final_loss")
    except (OSError, ValueError):
        return None
    return float(loss) if isinstance(loss, int | float) else None
