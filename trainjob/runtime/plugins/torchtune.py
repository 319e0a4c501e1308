"""torchtune on the torch policy (upstream Trainer's rules): a TrainJob whose command is just
``tune run`` on a ``torchtune-<model>-<size>`` runtime gets the rest of the command made for
it: the rendezvous endpoint when more than one process runs, the recipe and config chosen by
node count, processes and LoRA/QLoRA arguments, and the runtime command's settings that the
runtime owns (output, tokenizer and checkpoint paths)."""

from __future__ import annotations

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import Problems
from trainjob.runtime.podsets import RuntimeInfo

ENTRYPOINT = ["tune", "run"]
# Settings of the runtime's command the TrainJob may not change.
IMMUTABLE_CONFIGS = ("output_dir", "tokenizer.path", "checkpointer.checkpoint_dir",
                     "tokenizer.merges_file")
LORA_ATTN_MODULES = "model.lora_attn_modules"
QUANTIZE_BASE = "model.quantize_base"
USE_DORA = "model.use_dora"
SUPPORTED_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")
MULTI_NODE_MODEL = "llama3_3/70B"
# QLoRA has no recipe for this model; these run QLoRA on a single device only.
NO_QLORA_MODEL = "qwen2_5/1.5B"
SINGLE_DEVICE_QLORA_MODELS = ("llama3_2/1B", "llama3_2/3B")


def applies(job: TrainJob) -> bool:
    return job.spec.trainer is not None and job.spec.trainer.command == ENTRYPOINT


def model(job: TrainJob) -> str:
    """``torchtune-llama3.2-1b`` -> ``llama3_2/1B``; "" for another runtime name."""
    fields = job.spec.runtime_ref.name.split("-")
    if len(fields) != 3:
        return ""
    return f"{fields[1].replace('.', '_')}/{fields[2].upper()}"


def _bool_arg(args: list[str], item: str) -> bool:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and item in name and value.strip().lower() == "true":
            return True
    return False


def _lora(args: list[str]) -> bool:
    return any(LORA_ATTN_MODULES in arg for arg in args)


def _qlora(args: list[str]) -> bool:
    return not _bool_arg(args, USE_DORA) and _bool_arg(args, QUANTIZE_BASE)


def recipe_and_config(job: TrainJob, nodes: int, procs: int | None, gpus: int) -> tuple[str, str]:
    """The recipe and config for ``nodes`` nodes of ``procs`` processes (None: auto) and
    ``gpus`` GPUs each."""
    args = job.spec.trainer.args or []
    recipe, suffix = "full_finetune_distributed", "_full"
    if nodes == 1 and (procs == 1 or gpus == 1):
        if _qlora(args):
            recipe, suffix = "lora_finetune_single_device", "_qlora_single_device"
        elif _lora(args):
            recipe, suffix = "lora_finetune_single_device", "_lora_single_device"
        else:
            recipe, suffix = "full_finetune_single_device", "_full_single_device"
    elif nodes == 1 and _qlora(args):
        recipe, suffix = "lora_finetune_distributed", "_qlora"
    elif nodes == 1 and _lora(args):
        recipe, suffix = "lora_finetune_distributed", "_lora"
    elif nodes > 1:
        suffix = "_full_multinode"
    return recipe, f"{model(job)}{suffix}"


def command(info: RuntimeInfo, job: TrainJob, nodes: int, procs: int | None, gpus: int,
            runtime_command: list[str]) -> list[str]:
    """The whole trainer command for a ``tune run`` TrainJob."""
    expanded = list(ENTRYPOINT)
    if nodes > 1 or (procs is not None and procs > 1) or (procs is None and gpus > 1):
        expanded.append(f"--rdzv_endpoint={job.metadata.name}-{c.NODE}-0-0."
                        f"{job.metadata.name}:29500")
    recipe, config = recipe_and_config(job, nodes, procs, gpus)
    expanded += [recipe, "--config", config]
    expanded += [arg for arg in runtime_command if arg.split("=")[0] in IMMUTABLE_CONFIGS]
    return expanded


def validate(job: TrainJob, nodes: int, procs: int | None = None, gpus: int = 0) -> Problems:
    """What upstream refuses in a torchtune TrainJob of ``nodes`` nodes of ``procs``
    processes (None: auto) and ``gpus`` GPUs each."""
    problems: Problems = []
    name = model(job)
    if name not in SUPPORTED_MODELS:
        problems.append(("spec.runtimeRef.name", f"{job.spec.runtime_ref.name!r} names no "
                         f"supported pretrained model ({', '.join(SUPPORTED_MODELS)})"))
    if nodes > 1 and name != MULTI_NODE_MODEL:
        problems.append(("spec.trainer.numNodes", f"must be 1 for the {name} model"))
    args = job.spec.trainer.args or []
    if nodes > 1 and (_lora(args) or _qlora(args)):
        problems.append(("spec.trainer.numNodes",
                         "LoRA fine-tuning is not supported for multi-node training"))
    problems += _check_qlora(job, name, nodes, procs, gpus)
    for i, arg in enumerate(args):
        key = arg.split("=", 1)[0]
        if key in IMMUTABLE_CONFIGS:
            problems.append((f"spec.trainer.args[{i}]", f"{key} is set by the runtime and may "
                                                        "not be changed"))
    return problems


def _check_qlora(job: TrainJob, name: str, nodes: int, procs: int | None,
                 gpus: int) -> Problems:
    """The QLoRA config the job would run (upstream's rules): none for one model, a single
    device only for others."""
    _, config = recipe_and_config(job, nodes, procs, gpus)
    if "_qlora" not in config:
        return []
    problems: Problems = []
    if name == NO_QLORA_MODEL:
        problems.append(("spec.runtimeRef.name", f"the {name} model has no QLoRA recipe"))
    if "_qlora_single_device" not in config and name in SINGLE_DEVICE_QLORA_MODELS:
        problems += [("spec.trainer.numProcPerNode", f"QLoRA on the {name} model runs one "
                      "process per node: auto or 1"),
                     ("spec.trainer.resourcesPerNode", f"QLoRA on the {name} model runs on "
                      "one GPU per node")]
    return problems
