#!/usr/bin/env python
"""Masked-LM training of ModernBERT with the Hugging Face Trainer, profiled by hf_distprof (the code behind
``python_scripts/train_modernBERT.py``, and ``hf-distprof scaling``'s default script).

Launch it through ``local_scripts/train_lambda.sh`` (accelerate) or ``torchrun``; it also runs as a plain
single process. With no model or data flags it runs offline: a tiny ModernBERT built from its config, a
WordPiece tokenizer trained in seconds on the docstrings of this Python's standard library (text that is
on every machine with Python), and a ``datasets.Dataset`` of that text. ``--model-name-or-path`` and
``--dataset-name`` / ``--train-file`` switch to a real model and data.

    NPROC=2 ./local_scripts/train_lambda.sh --enable-profiling --enable-memory-logging --max-steps 50
    NPROC=2 ./local_scripts/train_lambda.sh --strategy fsdp --enable-profiling --max-steps 10

``--strategy fsdp`` shards with FSDP2 on every machine (``hf_distprof.recipe.strategy``): through accelerate's FSDP
plugin on GPU, at load time through transformers' ``DistributedConfig`` on CPU, where accelerate would
silently train DDP.

``--nccl-debug``, ``--torch-distributed-debug`` and ``--flight-recorder-entries`` (``hf_distprof.recipe.debug_env``)
become environment variables before ``TrainingArguments`` is built, since building it creates the process
group under a launcher, and the group reads them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import socket
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from datasets import Dataset, load_dataset
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    ModernBertForMaskedLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from hf_distprof.callbacks import build_callbacks
from hf_distprof.config import ProfilingArguments
from hf_distprof.core.argtypes import PositiveInt
from hf_distprof.recipe.debug_env import DEBUG_ENV_VARS, DebugArguments, apply_debug_env
from hf_distprof.dist import finish, get_logger
from hf_distprof.recipe.models import tiny_modernbert_config
from hf_distprof.recipe.strategy import (
    StrategyArguments,
    fsdp_training_arguments,
    load_sharded,
    on_gpu,
    shards_at_load,
)

logger = get_logger("train_modernBERT")

# Test-only: "<ranks>:<seconds>" makes those ranks ("1", "0,1" or "all") sleep in their data collator every
# batch: one slow rank, or a data-loading stall on all of them.
SLOW_RANK_ENV = "HF_DISTPROF_SIMULATE_SLOW_RANK"
# Test-only: "<ranks>:<MiB>" makes those ranks keep that much more memory alive at every optimizer step (a
# leak, as a loss appended to a list without .item() would make), for the memory-growth warning.
LEAK_ENV = "HF_DISTPROF_SIMULATE_LEAK"
# Test-only: "<ranks>:<n>" makes those ranks block forever in their data collator from its n-th call on (a hung
# rank), for the hang watchdog.
HANG_ENV = "HF_DISTPROF_SIMULATE_HANG"
# Test-only: a folder where every rank writes env_rank{R}.json once its process group exists: the debug flags'
# variables it sees (hf_distprof.recipe.debug_env.DEBUG_ENV_VARS), c10d's debug level and the group's CPU backend.
DUMP_ENV = "HF_DISTPROF_DUMP_ENV"
# Test-only: "1" makes every rank move its main thread to the next CPU it may use at every batch, rank r on CPU
# (r + batch) mod n: a crossover, so that a CPU that runs slower for a while slows each rank alike (AlternateCores).
ALTERNATE_CORES_ENV = "HF_DISTPROF_ALTERNATE_CORES"
# Set by train_lambda.sh for its pre-flight check: parse the flags, then exit before any work.
PARSE_ONLY_ENV = "HF_DISTPROF_PARSE_ONLY"
SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}


if TYPE_CHECKING:
    Fraction = float
else:

    class Fraction(float):
        """A number strictly between 0 and 1; its constructor is the argparse ``type`` of ``--mlm-probability``."""

        def __new__(cls, value: Any) -> Fraction:
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if not 0 < number < 1:  # NaN fails too
                raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {value!r}")
            return super().__new__(cls, number)


@dataclass
class ModelDataArguments:
    """What to train on. Leave everything unset for the offline tiny-model demo."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A pretrained model (hub id or folder); default: tiny ModernBERT from config."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "A datasets hub name or local dataset script."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Config of --dataset-name."})
    train_file: str | None = field(default=None, metadata={"help": "A local .txt, .json/.jsonl or .csv file."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    max_seq_length: PositiveInt = field(default=128, metadata={"help": "Tokens per training sequence."})
    mlm_probability: Fraction = field(
        default=0.3, metadata={"help": "Fraction of tokens masked, a number in (0, 1) (ModernBERT: 0.3)."}
    )
    tiny_hidden_size: PositiveInt = field(
        default=128, metadata={"help": "Hidden size of the tiny default model, a multiple of 8 (4 heads, even width)."}
    )
    tiny_num_layers: PositiveInt = field(default=4, metadata={"help": "Encoder layers of the tiny default model."})
    tiny_vocab_size: PositiveInt = field(
        default=8192, metadata={"help": "Vocabulary of the locally trained tokenizer."}
    )

    def __post_init__(self) -> None:
        # Checked here, before any work: a bad value would otherwise fail in the first step, on every rank.
        if not 0 < self.mlm_probability < 1:  # built directly, not parsed
            raise ValueError(f"--mlm-probability: must be a number in (0, 1), got {self.mlm_probability!r}")
        if self.tiny_hidden_size % 8:
            raise ValueError(
                f"--tiny-hidden-size: must be a multiple of 8 (4 attention heads of an even width for the rotary "
                f"embedding), got {self.tiny_hidden_size}"
            )


def corpus_cache_file(root: Path, min_chars: int) -> Path:
    """Where the demo corpus of this Python's standard library is kept between runs (and between ranks)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_distprof"
    key = hashlib.sha256(f"{sys.version}|{root}|{min_chars}".encode()).hexdigest()[:16]
    return base / f"stdlib_docstrings_{key}.json"


def stdlib_docstrings(min_chars: int = 40) -> list[str]:
    """Docstrings of the standard library's top-level modules, parsed (never imported) with ``ast``.

    Parsing takes ~4 s; the text is kept in ``~/.cache/hf_distprof`` (``$XDG_CACHE_HOME``), keyed by this
    Python's version and standard library path, so that the other ranks and the next runs read it instead. A
    cache that cannot be read or written is ignored.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    cache = corpus_cache_file(root, min_chars)
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if isinstance(cached, list) and cached and all(isinstance(t, str) for t in cached):
            return cached
    except (OSError, ValueError):
        pass
    texts = _parse_stdlib_docstrings(root, min_chars)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(texts), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass
    return texts


def _parse_stdlib_docstrings(root: Path, min_chars: int) -> list[str]:
    texts: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    texts.append(doc)
    if sum(map(len, texts)) < 100_000:
        raise RuntimeError(
            f"too little text in the Python standard library at {root} to train the demo tokenizer; "
            "pass --train-file with your own text"
        )
    return texts


def train_tiny_tokenizer(texts: list[str], vocab_size: int, save_dir: Path) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer on ``texts`` and save it to ``save_dir``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    tokenizer.save_pretrained(str(save_dir))
    return tokenizer


def load_text(data: ModelDataArguments) -> Dataset:
    """The training text as a one-column ``datasets.Dataset``."""
    if data.dataset_name:
        ds = load_dataset(data.dataset_name, data.dataset_config_name, split="train")
    elif data.train_file:
        ext = Path(data.train_file).suffix.lstrip(".")
        builder = {"txt": "text", "jsonl": "json"}.get(ext, ext)
        ds = load_dataset(builder, data_files={"train": data.train_file}, split="train")
    else:
        return Dataset.from_dict({"text": stdlib_docstrings()})
    if data.text_column not in ds.column_names:
        raise ValueError(f"--text-column {data.text_column!r} is not in the data; columns: {ds.column_names}")
    ds = ds.select_columns([data.text_column])
    # datasets refuses a rename onto the same name (a .txt file's column is already "text").
    return ds if data.text_column == "text" else ds.rename_column(data.text_column, "text")


def tokenize_into_blocks(ds: Dataset, tokenizer: Any, block: int) -> Dataset:
    """Tokenize, concatenate and cut into ``block``-token sequences (no padding, as run_mlm does)."""

    def tokenize(batch: dict[str, list[str]]) -> dict[str, Any]:
        return tokenizer(batch["text"], return_special_tokens_mask=True)

    def group(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
        joined = {k: list(itertools.chain.from_iterable(v)) for k, v in batch.items()}
        total = (len(joined["input_ids"]) // block) * block
        return {k: [v[i : i + block] for i in range(0, total, block)] for k, v in joined.items()}

    tokens = ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenize")
    return tokens.map(group, batched=True, desc=f"group into {block}-token blocks")


def build_model(
    data: ModelDataArguments, strategy: StrategyArguments, training_args: TrainingArguments, tokenizer: Any
) -> Any:
    """The model to train; sharded at load time for ``--strategy fsdp`` when training on the CPU.

    DDP, and FSDP on GPU (accelerate shards it when the Trainer prepares it), start from a whole model. On
    CPU, FSDP2 is applied by transformers as the weights are loaded, from a checkpoint folder: the tiny
    model's random initialisation is saved once for that (same seed, so the same weights as under DDP).
    """
    shard = shards_at_load(strategy, training_args)
    if data.model_name_or_path and not shard:
        return AutoModelForMaskedLM.from_pretrained(data.model_name_or_path)
    source: str | Path | None = data.model_name_or_path
    if source is None:
        config = tiny_modernbert_config(
            vocab_size=len(tokenizer), hidden_size=data.tiny_hidden_size, num_layers=data.tiny_num_layers,
            seq_len=data.max_seq_length, pad_token_id=tokenizer.pad_token_id,
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        )
        model = ModernBertForMaskedLM(config)
        if not shard:
            return model
        source = Path(training_args.output_dir) / "tiny_model_init"
        # Once per node (the output folder may be node-local); every node writes the same weights.
        with training_args.main_process_first(local=True, desc="tiny model checkpoint for FSDP loading"):
            if training_args.local_process_index == 0:
                model.save_pretrained(str(source))
    return load_sharded(
        AutoModelForMaskedLM, source, world_size=training_args.world_size,
        reshard_after_forward=strategy.fsdp_reshard_after_forward, bf16=training_args.bf16,
    )


class SlowRankCollator:
    """Wraps a collator so that one rank sleeps per batch: a deliberately slow rank for tests and demos."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return self.inner(features)


class AlternateCores:
    """Wraps a collator so that each batch moves the calling (main) thread to the next CPU: rank ``r`` runs its
    ``n``-th batch on CPU ``cpus[(r + n) % len(cpus)]``.

    The cores of a shared VM each switch between speeds ~20% apart for seconds at a time, independently of
    each other (DEVELOPING.md, "The scenario suite"). A rank that stays on one core for a short run inherits
    that core's speed, so a clean run can have a truly slower rank that is no rank's doing. Crossing the ranks
    over the cores at every step gives each rank each core alike: for the tests of silence on clean runs.
    """

    def __init__(self, inner: Any, rank: int) -> None:
        self.inner, self.rank, self.calls = inner, rank, 0
        self.cpus = sorted(os.sched_getaffinity(0))

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        os.sched_setaffinity(0, {self.cpus[(self.rank + self.calls) % len(self.cpus)]})  # 0: this thread
        self.calls += 1
        return self.inner(features)


class HangCollator:
    """Wraps a collator so that from its ``from_call``-th call on it never returns: a hung rank for tests."""

    def __init__(self, inner: Any, from_call: int) -> None:
        self.inner, self.from_call, self.calls = inner, from_call, 0

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls += 1
        if self.calls >= self.from_call:
            threading.Event().wait()  # blocks forever, as a stuck read or a dead file system would
        return self.inner(features)


class LeakCallback(TrainerCallback):
    """Keeps ``mib`` MiB more alive at every optimizer step: a deliberate leak for tests and demos."""

    def __init__(self, mib: float) -> None:
        self.mib, self.kept = mib, []

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.kept.append(torch.ones(int(self.mib * 2**20) // 4))  # touched, so resident


def selected(spec: str, rank: int) -> bool:
    """Whether ``rank`` is named by a test hook's rank list ("1", "0,1" or "all")."""
    return spec == "all" or rank in {int(r) for r in spec.split(",")}


def build_parser() -> HfArgumentParser:
    """The script's flags: model/data, parallel strategy, NCCL/c10d debugging, profiling, and the Trainer's own."""
    parser = HfArgumentParser(
        (ModelDataArguments, StrategyArguments, DebugArguments, ProfilingArguments, TrainingArguments)
    )
    # Demo defaults; every one of them can be overridden on the command line.
    parser.set_defaults(
        output_dir="./outputs/modernbert", max_steps=50, per_device_train_batch_size=8, learning_rate=5e-4,
        logging_steps=5, report_to=["tensorboard"], save_strategy="no", ddp_find_unused_parameters=False,
        dataloader_num_workers=0, seed=42,
        # Without use_cpu on a machine with no GPU, TrainingArguments sees DistributedType.NO under
        # `accelerate launch --multi_gpu` and every rank trains alone (no DDP, no gradient all-reduce).
        use_cpu=not torch.cuda.is_available(),
    )
    return parser


def parse_debug_args(parser: HfArgumentParser) -> tuple[DebugArguments, str, str | None]:
    """The debug flags, and the folder and run name their files go under, with nothing else built yet.

    Any invalid value on the command line exits with status 2 and the flag's name, as in :func:`parse_args`.
    """
    namespace = parser.parse_args()
    try:
        debug = DebugArguments(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(DebugArguments)})
    except ValueError as err:
        parser.error(str(err))
    return debug, namespace.profiler_output_dir, namespace.profiler_run_name


def parse_args(
    parser: HfArgumentParser,
) -> tuple[ModelDataArguments, StrategyArguments, ProfilingArguments, TrainingArguments]:
    """Parse the command line; any invalid value exits with status 2 and the flag's name, no traceback."""
    try:
        data_args, strategy_args, debug_args, prof_args, training_args = parser.parse_args_into_dataclasses()
        strategy_args.check(training_args, cuda=on_gpu(training_args))
        if debug_args.torch_distributed_debug == "DETAIL" and strategy_args.strategy == "ddp" and not on_gpu(
            training_args
        ):
            # Seen with torch 2.13: c10d::Logger::set_env_variables segfaults building DDP over the gloo group
            # that DETAIL wraps in its collective checker (FSDP, which builds no DDP logger, runs).
            raise ValueError(
                "--torch-distributed-debug DETAIL crashes DDP on gloo (SIGSEGV when DDP is built, PyTorch "
                f"{torch.__version__}): use INFO, or DETAIL with --strategy fsdp"
            )
        return data_args, strategy_args, prof_args, training_args
    except ValueError as err:
        # Cross-field checks in the dataclasses' __post_init__ raise ValueError: report them like argparse.
        parser.error(str(err))


def dump_debug_env(folder: Path, rank: int) -> None:
    """Test hook (``HF_DISTPROF_DUMP_ENV``): what this rank's process group was created with.

    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` seen when the group was created wraps its CPU backend in a
    ``_ProcessGroupWrapper``, so the backend's type shows that the variables came in time.
    """
    seen = {name: os.environ[name] for name in DEBUG_ENV_VARS if name in os.environ}
    world = dist.group.WORLD if dist.is_initialized() else None
    backend = world._get_backend(torch.device("cpu")) if world is not None else None
    record = {"env": seen, "c10d_debug_level": dist.get_debug_level().name, "backend": type(backend).__name__}
    (folder / f"env_rank{rank}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = build_parser()
    parse_only = os.environ.get(PARSE_ONLY_ENV) == "1"  # the launcher's pre-flight check of the flags
    debug_args, profiler_output_dir, profiler_run_name = parse_debug_args(parser)
    if not parse_only:
        # Before TrainingArguments: building it creates the process group (under a launcher), and NCCL and c10d
        # read these variables then.
        apply_debug_env(debug_args, profiler_output_dir, profiler_run_name)
    data_args, strategy_args, prof_args, training_args = parse_args(parser)
    if parse_only:
        return
    # TrainingArguments set up the device and process group; before that process_index and world_size read 0, 1.
    rank = training_args.process_index
    dump_to = os.environ.get(DUMP_ENV)
    if dump_to:
        dump_debug_env(Path(dump_to), rank)
    logging.basicConfig(
        # hf_distprof's loggers (and this script's) put "[RANK n]" in front of their messages themselves.
        format="%(asctime)s %(name)s: %(message)s",
        level=logging.INFO if training_args.should_log else logging.WARNING,
    )
    if not training_args.should_log:
        # The console shows rank 0 (and every rank's errors); each rank's warnings go to rank{R}.log in the
        # run folder, which hf_distprof opens at train start.
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.ERROR)
    set_seed(training_args.seed)
    output_dir = Path(training_args.output_dir)
    # Fix the Trainer's TensorBoard folder up front so our memory scalars land in the same run as the loss.
    os.environ.setdefault(
        "TENSORBOARD_LOGGING_DIR", str(output_dir / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}_{socket.gethostname()}")
    )

    with training_args.main_process_first(desc="tokenizer and dataset"):
        text = load_text(data_args)
        if data_args.model_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(data_args.model_name_or_path)
        else:
            tok_dir = output_dir / "tiny_tokenizer"
            if (tok_dir / "tokenizer.json").exists():
                tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
            else:
                tokenizer = train_tiny_tokenizer(list(text["text"]), data_args.tiny_vocab_size, tok_dir)
        train_ds = tokenize_into_blocks(text, tokenizer, data_args.max_seq_length)

    model = build_model(data_args, strategy_args, training_args, tokenizer)
    # --strategy fsdp on GPU: accelerate's FSDP2, configured for this model's blocks (unchanged otherwise).
    training_args = fsdp_training_arguments(strategy_args, training_args, model)
    logger.info(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")

    collator: Any = DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)
    slow = os.environ.get(SLOW_RANK_ENV)
    if slow:
        who, seconds = slow.split(":")
        if selected(who, rank):
            collator = SlowRankCollator(collator, float(seconds))

    hang = os.environ.get(HANG_ENV)
    if hang:
        who, from_call = hang.split(":")
        if selected(who, rank):
            collator = HangCollator(collator, int(from_call))

    if os.environ.get(ALTERNATE_CORES_ENV) == "1":
        collator = AlternateCores(collator, rank)

    callbacks = build_callbacks(prof_args)
    leak = os.environ.get(LEAK_ENV)
    if leak:
        who, mib = leak.split(":")
        if selected(who, rank):
            callbacks.append(LeakCallback(float(mib)))
    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_ds, data_collator=collator,
        processing_class=tokenizer, callbacks=callbacks,
    )
    # --resume-from-checkpoint: the Trainer restores the step, and hf_distprof's schedule counts from it.
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    # hf_distprof.callbacks.summary.RunSummaryCallback (last of build_callbacks) printed where the files are.


def run() -> None:
    """:func:`main`, then the process's end: the process group destroyed, and no C++ teardown."""
    try:
        main()
    finally:
        # Without this a multi-rank run occasionally dies with SIGABRT at exit.
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    # Training and every file are done: leave without the interpreter's C++ teardown, where gloo's threads
    # still aborted a finished 2-rank run now and then (CI: an FSDP run, SIGABRT after its last step).
    finish(0)


if __name__ == "__main__":
    run()
