"""Peak memory per trainer process: ``training.strategy`` ddp against fsdp2 (full sharding),
2 processes on CPU + gloo.

    python benchmarks/fsdp_memory.py                            # a random 1.4B-parameter Llama
    python benchmarks/fsdp_memory.py --quick --output /tmp/x.json   # the tiny model, seconds

The model is a random Llama in float32 over the tests' small tokenizer, so the decoder blocks
hold nearly all the weights (``--hidden``, ``--layers``, ``--intermediate`` set its size); it is
built once into ``--model-dir``. Each strategy runs one step of the toy job (test/Scripted-v0,
two agents, one LoRA adapter each, no evaluation) under ``torchrun --nproc_per_node
--processes``. Each process records its peak resident memory (``VmHWM``, reset between phases
through ``/proc/self/clear_refs``) in three phases, with the same kernels on both sides
(:data:`SAME_ON_BOTH_SIDES`):

* **load**: the base loaded, sharded under fsdp2, the optimizers built;
* **rollout**: the transformers engine plays the step's tasks (under fsdp2 with the whole model
  gathered: :mod:`llm_zoo_train.models.sharding`);
* **update**: both adapters' forward/backward passes and optimizer steps.

The update phase is what a trainer whose generation runs elsewhere (a vLLM server, or
``rollout.engine: replay``) peaks at. At each phase's end the resident memory is split into the
process's own pages and pages of mapped files: on a CPU, ddp's weights stay memory-mapped from
the model's files, pages the processes share through the page cache, so the machine holds one
base for all of them; fsdp2's slices are each process's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, RESULTS_DIR, bar_chart, finish, run_facts

PHASES = ("load", "rollout", "update")
#: The CPU speed kernels keep copies of whole weights (packed for the decode, W and W^T for the
#: update) and keep_freed_memory keeps freed memory in the process: fsdp2 turns them off, so ddp
#: is measured without them too, and the figures compare the strategies alone.
SAME_ON_BOTH_SIDES = (
    "--training.update_kernel", "exact", "--rollout.pack_base_weights", "false",
    "--training.keep_freed_memory", "false",
)  # fmt: skip


def _peak_gib() -> float:
    """This process's peak resident memory since the last reset, in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc/self/status")


def _resident_gib() -> dict[str, float]:
    """This process's resident memory now, in GiB: ``anon`` (its own) and ``file`` (pages of
    mapped files, such as memory-mapped weights, which processes mapping one file share)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {
        key: int(fields[name].split()[0]) / 2**20 for key, name in (("anon", "RssAnon"), ("file", "RssFile"))
    }


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident size


def child(config_path: str, overrides: list[str], report: Path) -> None:
    """One trainer process under torchrun: the phases' peaks into ``report``-RANK.json."""
    sys.path.insert(0, str(REPO / "tests"))
    import toy_envs_trainer  # noqa: F401  (registers test/Scripted-v0)
    from llm_zoo_train.config import load_config
    from llm_zoo_train.trainer import Trainer

    peaks: dict[str, float] = {}
    resident: dict[str, dict[str, float]] = {}
    _reset_peak()
    trainer = Trainer(load_config(config_path, overrides))
    peaks["load"], resident["load"] = _peak_gib(), _resident_gib()
    _reset_peak()
    started = time.perf_counter()
    produced = trainer._rollout(1)
    seconds = {"rollout": time.perf_counter() - started, "generation": produced.generation_seconds}
    peaks["rollout"], resident["rollout"] = _peak_gib(), _resident_gib()
    _reset_peak()
    trainer._rollout = lambda step, envs=None: produced  # the update of the rollout just measured
    metrics = trainer.train_step(1)
    seconds["update"] = metrics["time/update"]
    peaks["update"], resident["update"] = _peak_gib(), _resident_gib()
    rank = trainer.accelerator.process_index
    record = {
        "rank": rank,
        "peak_gib": peaks,
        "resident_at_end_gib": resident,
        "seconds": seconds,
        "samples": {k: v for k, v in metrics.items() if k.endswith("/samples")},
    }
    Path(f"{report}-{rank}.json").write_text(json.dumps(record))


def build_model(directory: Path, hidden: int, layers: int, intermediate: int) -> dict[str, Any]:
    """The random Llama (float32) in ``directory``, built unless it is there; returns its sizes."""
    sys.path.insert(0, str(REPO / "tests"))
    import torch
    from transformers import LlamaForCausalLM

    from tiny_model import build_tokenizer, tiny_llama_config

    tokenizer = build_tokenizer()
    heads = max(hidden // 128, 4)
    config = tiny_llama_config(
        tokenizer,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 4, 1),
    )
    if not (directory / "config.json").is_file():
        torch.manual_seed(0)
        with torch.device("cpu"):
            model = LlamaForCausalLM(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        parameters = sum(p.numel() for p in model.parameters())
        del model
    else:
        with torch.device("meta"):
            parameters = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    return {"parameters": parameters, "float32_gib": round(parameters * 4 / 2**30, 2)}


def run_strategy(
    strategy: str, processes: int, model_dir: Path, workdir: Path, extra: list[str]
) -> list[dict]:
    config = workdir / "toy.yaml"
    config.write_text(
        "env: {id: test/Scripted-v0, kwargs: {max_turns: 1}, plugins: [toy_envs_trainer]}\n"
        "eval: {num_episodes: 0}\n"
        "logging: {plot: false, progress_bar: false}\n"
        "lora: {lora_alpha: 16, r: 8, target_modules: [q_proj, v_proj]}\n"
        f"model: {{name_or_path: {model_dir}}}\n"
        "rollout: {envs_per_step: 2, max_completion_length: 8, num_generations: 2}\n"
        f"training: {{max_steps: 1, per_device_train_batch_size: 8, output_dir: {workdir / strategy}}}\n"
    )
    report = workdir / f"peaks-{strategy}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "benchmarks"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [
        str(torchrun if torchrun.exists() else shutil.which("torchrun")),
        "--nproc_per_node",
        str(processes),
    ]
    command += [__file__, "--child", str(config), str(report), "--", "--training.strategy", strategy]
    command += [*SAME_ON_BOTH_SIDES, *extra]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{strategy} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return [json.loads(Path(f"{report}-{rank}.json").read_text()) for rank in range(processes)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model: checks the script only")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "llm-zoo-fsdp-memory-model"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "fsdp_memory.json")
    args = parser.parse_args(argv)
    facts = run_facts(__file__, argv)
    if args.quick:
        args.hidden, args.layers, args.intermediate = 64, 2, 128
        args.model_dir = Path(tempfile.mkdtemp(prefix="fsdp-memory-quick-"))
    model = build_model(args.model_dir, args.hidden, args.layers, args.intermediate)
    print(
        f"model: {model['parameters'] / 1e9:.2f}B parameters, {model['float32_gib']} GiB in float32",
        flush=True,
    )
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fsdp-memory-") as tmp:
        for strategy in ("ddp", "fsdp2"):
            runs[strategy] = run_strategy(strategy, args.processes, args.model_dir, Path(tmp), [])
            peaks = {phase: max(r["peak_gib"][phase] for r in runs[strategy]) for phase in PHASES}
            print(f"{strategy}: " + ", ".join(f"{p} {v:.2f} GiB" for p, v in peaks.items()), flush=True)
    result = {
        **facts,
        "quick": args.quick,
        "processes": args.processes,
        "model": {**model, "hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate},
        "same_on_both_sides": list(SAME_ON_BOTH_SIDES),
        "runs": runs,
    }

    def plot(png: Path) -> None:
        bar_chart(
            png,
            f"Peak resident memory per process, {args.processes} processes, {model['parameters'] / 1e9:.2f}B float32",
            list(PHASES),
            {s: [max(r["peak_gib"][p] for r in runs[s]) for p in PHASES] for s in runs},
            ylabel="GiB (the busiest process)",
        )

    finish(result, args.output, plot)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        config_path, report = sys.argv[2], Path(sys.argv[3])
        child(config_path, sys.argv[5:], report)
    else:
        main()
