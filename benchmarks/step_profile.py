"""Where our trainer's step goes, against this machine's own limits (issue 56's profile).

Runs the job of ``trainer_vs_trl.py`` on our side only (the same model, LoRA, prompts, K, lengths,
micro-batches and "auto" kernel choices: ``_trl_job.make_ours``) for a few steps in one process and
times each phase of a step in place: timers around the engine's ``generate``, the update, its
backward and optimizer step, and forward hooks on the decoder body and the vocabulary projection.
No torch profiler: its cost per operator inflates the many small ones several fold (on the AMD EPYC
it put a decode step's attention at 0.36 ms a layer, while swapping it for the grouped products,
timed in place, changed nothing), and the ranking of phases with it.

Then, with the same thread count, it measures the machine's limits:

* the fastest product of the model's own MLP shape (256 rows, the update's order of rows), by
  ``F.linear`` and by oneDNN's packed copy, in float32 and bfloat16, in GFLOP/s;
* memory bandwidth: reading 256 MiB (a sum) and copying it, in GB/s.

Phases of a step (median seconds over the timed steps):

* generation: the prefill passes (prompts), the decode passes' decoder body and their vocabulary
  projection, the adapters merged into the packed copies (where the engine serves them merged),
  and the rest of ``generate`` (sampling, logprobs, the cache, Python);
* update: the forward passes (body and projection, autograd on), the backward, the optimizer steps,
  and the rest (token log-probabilities, the loss);
* the step's remainder (env scoring, advantages, bookkeeping).

For the phases made mostly of linear products it counts their floating-point operations from the
rows that went through: 2 x rows x the frozen layers' weights, and for the backward the same count
again (the input gradients through the frozen weights; the update's forward counts are used). A
completion or prompt pass that took the rollout's recorded outputs (``training.rollout_activations_mb``)
multiplies by no frozen weight in its forward: its rows count for the backward only.
Attention and the LoRA products are not counted, so the achieved GFLOP/s are lower bounds. The
decode passes also get the frozen weights' bytes read per second (each pass reads every weight
once) against the measured read bandwidth.

    python benchmarks/step_profile.py --threads 1 --steps 6                    # float32 (~3 min)
    python benchmarks/step_profile.py --threads 1 --steps 6 --dtype bfloat16
    python benchmarks/step_profile.py --quick --output-dir /tmp/bench         # smoke run: tiny model

Each CPU model and dtype has its own result, named as ``trainer_vs_trl.py`` names them
(``step_profile.json`` for the AMD EPYC, ``step_profile_intel_xeon.json``, ``_bfloat16``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import RESULTS_DIR, bar_chart, finish, run_facts
from _trl_job import ENV_ID, WriteAboutEnv, add_job_arguments, make_ours, model_dir
from trainer_vs_trl import cpu_isa_flags, result_stem

import llm_zoo
from llm_zoo_train.kernels.choices import describe_kernel_choices, measured_kernel_choices
from llm_zoo_train.runs.memory import keep_freed_memory
from llm_zoo_train.training import update as update_module

#: The step's phases, in the order they are reported.
PHASES = (
    "generation/prefill",
    "generation/decode body",
    "generation/decode vocabulary",
    "generation/merge adapters",
    "generation/rest",
    "update/forward",
    "update/backward",
    "update/optimizer",
    "update/rest",
    "step/rest",
)


# ----------------------------------------------------------------------------- the machine's limits


def _best_seconds(call: Callable[[], Any], repeats: int = 5, inner: int = 5) -> float:
    call()  # warm-up: first-touch pages, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            call()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def product_peaks(rows: int, in_features: int, out_features: int) -> dict[str, dict[str, float]]:
    """GFLOP/s of ``[rows, in] x [in, out]`` by ``F.linear`` and by oneDNN's packed copy (where
    this torch has it), per dtype."""
    flops = 2.0 * rows * in_features * out_features
    generator = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, in_features, generator=generator).to(dtype)
        weight = (0.02 * torch.randn(out_features, in_features, generator=generator)).to(dtype)
        methods = {"F.linear": lambda x=x, weight=weight: F.linear(x, weight)}
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            methods["onednn"] = lambda x=x, packed=packed: torch.ops.mkldnn._linear_pointwise(
                x, packed, None, "none", [], ""
            )
        out[str(dtype).removeprefix("torch.")] = {
            name: flops / _best_seconds(call) / 1e9 for name, call in methods.items()
        }
    return out


def memory_bandwidth(mib: int = 256) -> dict[str, float]:
    """GB/s reading ``mib`` MiB (a sum) and copying them (read + write)."""
    source = torch.ones(mib * 2**20 // 4)
    target = torch.empty_like(source)
    size = source.numel() * 4
    return {
        "read_gbs": size / _best_seconds(source.sum, repeats=3, inner=2) / 1e9,
        "copy_gbs": 2 * size / _best_seconds(lambda: target.copy_(source), repeats=3, inner=2) / 1e9,
    }


# ----------------------------------------------------------------------------- timing a step in place


class StepTimers:
    """Timers around a trainer's phases (module docstring); ``take()`` returns and resets one step's."""

    def __init__(self, trainer: Any) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.rows: dict[str, int] = defaultdict(int)
        policy_model = trainer.policy.model
        base = policy_model.get_base_model() if hasattr(policy_model, "get_base_model") else policy_model
        self.hidden = int(base.config.hidden_size)
        self._pass_phase = "generation/prefill"
        self._watch_replays()
        self.body_weights = sum(
            module.in_features * module.out_features
            for name, module in base.model.named_modules()
            if isinstance(module, torch.nn.Linear) and "lora_" not in name
        )
        self.head_weights = base.lm_head.in_features * base.lm_head.out_features
        self.body_bytes = sum(
            module.weight.numel() * module.weight.element_size()
            for name, module in base.model.named_modules()
            if isinstance(module, torch.nn.Linear) and "lora_" not in name
        )
        self._hook(base.model, "body", self._body_phase, self._body_rows)
        self._hook(
            base.lm_head, "head", self._head_phase, lambda args, kwargs: args[0].numel() // self.hidden
        )
        self._wrap(trainer.engine, "generate", "generation")
        self._wrap(trainer.updater, "update", "update")
        self._wrap(trainer.updater.accelerator, "backward", "update/backward")
        self._wrap(trainer.updater, "_optimizer_step", "update/optimizer")
        merged = getattr(getattr(trainer.engine, "packed_weights", None), "merged", None)
        if merged is not None:
            self._wrap(merged, "_packing", "generation/merge adapters")

    def _watch_replays(self) -> None:
        """Notes while the update's completion or prompt pass takes the rollout's recorded outputs
        (``training.rollout_activations_mb``): its forward then multiplies by no frozen weight, and
        its rows count for the backward's products only."""
        self._replaying = False
        for name in ("replayed_completion_pass", "replayed_prompt_pass"):
            setattr(update_module, name, self._noting(getattr(update_module, name)))

    def _noting(self, replay: Callable[..., Any]) -> Callable[..., Any]:
        @contextmanager
        def noted(*args: Any, **kwargs: Any) -> Iterator[None]:
            with replay(*args, **kwargs):
                self._replaying = True
                try:
                    yield
                finally:
                    self._replaying = False

        return noted

    @staticmethod
    def _body_rows(args: tuple, kwargs: dict[str, Any]) -> int:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            embeds = kwargs["inputs_embeds"]
            return embeds.numel() // embeds.shape[-1]
        return ids.numel()

    def _body_phase(self, args: tuple, kwargs: dict[str, Any]) -> str:
        if torch.is_grad_enabled():
            return "update/forward"
        ids = kwargs.get("input_ids", args[0] if args else None)
        length = ids.shape[-1] if ids is not None else kwargs["inputs_embeds"].shape[1]
        self._pass_phase = "generation/decode body" if length == 1 else "generation/prefill"
        return self._pass_phase

    def _head_phase(self, args: tuple, kwargs: dict[str, Any]) -> str:
        """The projection belongs to the pass whose body ran last (a prefill projects its last
        position only, a row like a decode step's)."""
        if torch.is_grad_enabled():
            return "update/forward"
        return (
            "generation/decode vocabulary" if self._pass_phase.endswith("decode body") else self._pass_phase
        )

    def _hook(self, module: torch.nn.Module, part: str, phase: Callable, rows: Callable) -> None:
        started: list[tuple[float, str]] = []

        def before(mod: Any, args: tuple, kwargs: dict[str, Any]) -> None:
            name = phase(args, kwargs)
            counted = "update/replayed" if name == "update/forward" and self._replaying else name
            self.rows[f"{counted}|{part}"] += rows(args, kwargs)
            started.append((time.perf_counter(), name))

        def after(mod: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
            start, name = started.pop()
            self.seconds[name] += time.perf_counter() - start

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True)

    def _wrap(self, owner: Any, method: str, phase: str) -> None:
        call = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        setattr(owner, method, timed)

    def take(self, step_seconds: float) -> dict[str, Any]:
        s = self.seconds
        generation_parts = sum(s[p] for p in PHASES if p.startswith("generation/") and p != "generation/rest")
        phases = {p: s[p] for p in PHASES if not p.endswith("rest")}
        phases["generation/rest"] = s["generation"] - generation_parts
        phases["update/rest"] = (
            s["update"] - s["update/forward"] - s["update/backward"] - s["update/optimizer"]
        )
        phases["step/rest"] = step_seconds - s["generation"] - s["update"]
        result = {"step": step_seconds, "phases": phases, "rows": dict(self.rows)}
        self.seconds, self.rows = defaultdict(float), defaultdict(int)
        return result


def product_gflop(timers: StepTimers, rows: dict[str, int]) -> dict[str, float]:
    """GFLOP of the frozen layers' products in each phase that is mostly products."""

    def gflop(phase: str) -> float:
        return (
            2.0
            * (
                rows.get(f"{phase}|body", 0) * timers.body_weights
                + rows.get(f"{phase}|head", 0) * timers.head_weights
            )
            / 1e9
        )

    forward = gflop("update/forward")  # the passes computed; replayed ones multiply by nothing
    return {
        "generation/prefill": gflop("generation/prefill"),
        "generation/decode body": gflop("generation/decode body"),
        "generation/decode vocabulary": gflop("generation/decode vocabulary"),
        "update/forward": forward,
        # The input gradients through the same frozen weights, of every pass.
        "update/backward": forward + gflop("update/replayed"),
    }


# ----------------------------------------------------------------------------- the update's operators

#: Operators that multiply by a frozen weight in the update: oneDNN's and MKL's packed products
#: serve only frozen layers; a plain product ``[M, K] x [K, N]`` counts when none of M, K, N is
#: below 64 (a LoRA product has the rank, 8, as one of them, forward and backward).
PACKED_PRODUCT_OPS = frozenset({"mkldnn::_linear_pointwise", "mkl::_mkl_linear"})
PLAIN_PRODUCT_OPS = frozenset({"aten::mm", "aten::addmm"})


def _product_sides(shapes: list[list[int]]) -> tuple[int, ...] | None:
    """M, K and N of a plain product ``mm(a, b)`` or ``addmm(bias, a, b)`` from its input shapes."""
    matrices = [shape for shape in shapes if len(shape) == 2]
    if len(matrices) < 2:
        return None
    (rows, inner), (_, columns) = matrices[-2], matrices[-1]
    return rows, inner, columns


def update_operators(trainer: Any, step: int, unprofiled_s: float, top: int = 12) -> dict[str, Any]:
    """Train step ``step`` with its update under torch's profiler (shapes recorded): the update's
    operators' own CPU time, and the share spent in products by frozen weights.

    The profiler's cost per operator is why the step's phases are timed without it; for the update
    (mostly large products) it is small, and the result says how small: the profiled update's
    seconds beside ``unprofiled_s``, the timed steps' median."""
    from torch.profiler import ProfilerActivity, profile

    own: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    totals = {"profiled_update_s": 0.0, "frozen_products_s": 0.0}
    update = trainer.updater.update

    def profiled(*args: Any, **kwargs: Any) -> Any:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
            start = time.perf_counter()
            result = update(*args, **kwargs)
            totals["profiled_update_s"] += time.perf_counter() - start
        for event in profiler.key_averages(group_by_input_shape=True):
            seconds = event.self_cpu_time_total / 1e6
            own[event.key] += seconds
            calls[event.key] += event.count
            sides = _product_sides(event.input_shapes or []) if event.key in PLAIN_PRODUCT_OPS else None
            if event.key in PACKED_PRODUCT_OPS or (sides is not None and min(sides) >= 64):
                totals["frozen_products_s"] += seconds
        return result

    trainer.updater.update = profiled
    try:
        trainer.train_step(step)
    finally:
        trainer.updater.update = update
    ranked = sorted(own, key=own.get, reverse=True)[:top]
    return {
        **totals,
        "unprofiled_update_s": unprofiled_s,
        "operators_s": sum(own.values()),
        "top_operators": [{"name": name, "self_s": own[name], "calls": calls[name]} for name in ranked],
    }


# ----------------------------------------------------------------------------- the run


def profile(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    path = model_dir(args, workdir)
    trainer, _ = make_ours(args, path, workdir, args.warmup_steps + args.steps + 1)
    timers = StepTimers(trainer)
    steps = []
    for step in range(args.warmup_steps + args.steps):
        start = time.perf_counter()
        trainer.train_step(step)
        measured = timers.take(time.perf_counter() - start)
        if step >= args.warmup_steps:
            steps.append(measured)
            print(f"step {step}: {measured['step']:.2f} s", flush=True)
    decode_rows = statistics.median(s["rows"].get("generation/decode body|body", 0) for s in steps)
    median = {p: statistics.median(s["phases"][p] for s in steps) for p in PHASES}
    median_rows = {k: int(statistics.median(s["rows"].get(k, 0) for s in steps)) for k in steps[0]["rows"]}
    gflop = product_gflop(timers, median_rows)
    config = trainer.policy.model.get_base_model().config
    update_s = statistics.median(
        sum(v for p, v in s["phases"].items() if p.startswith("update/")) for s in steps
    )
    operators = update_operators(trainer, args.warmup_steps + args.steps, update_s)
    summary = {
        "step_s": statistics.median(s["step"] for s in steps),
        "phases_s": median,
        "product_gflop": gflop,
        "product_gflops": {p: g / median[p] for p, g in gflop.items() if median[p] > 0},
        "decode_rows_per_step": decode_rows,
        "body_weight_bytes": timers.body_bytes,
    }
    trainer.close()
    limits = {
        "products": product_peaks(256, config.hidden_size, config.intermediate_size),
        "product_shape": [256, config.hidden_size, config.intermediate_size],
        **memory_bandwidth(args.bandwidth_mib),
    }
    peak = max(limits["products"][args.dtype].values())
    summary["products_at_peak_s"] = sum(gflop.values()) / peak
    update_gflop = gflop["update/forward"] + gflop["update/backward"]
    if operators["frozen_products_s"] > 0:
        operators["frozen_products_gflops"] = update_gflop / operators["frozen_products_s"]
    return {
        "steps": steps,
        "summary": summary,
        "update_operators": operators,
        "limits": limits,
        "kernel_choices": measured_kernel_choices(),
    }


def print_summary(result: dict[str, Any]) -> None:
    summary, limits = result["summary"], result["limits"]
    dtype = result["settings"]["dtype"]
    peak = max(limits["products"][dtype].values())
    print(f"\nstep {summary['step_s']:.2f} s (median); {dtype} product peak {peak:.0f} GFLOP/s, "
          f"read {limits['read_gbs']:.1f} GB/s")  # fmt: skip
    for phase in PHASES:
        seconds = summary["phases_s"][phase]
        line = f"  {phase:30s} {seconds:7.3f} s {100 * seconds / summary['step_s']:5.1f}%"
        rate = summary["product_gflops"].get(phase)
        if rate is not None:
            line += f"  {rate:6.1f} GFLOP/s ({100 * rate / peak:3.0f}% of peak)"
        print(line)
    print(f"  every counted product at the peak: {summary['products_at_peak_s']:.2f} s a step")
    operators = result["update_operators"]
    rate = operators.get("frozen_products_gflops")
    print(f"  the update under the profiler: {operators['profiled_update_s']:.2f} s "
          f"(unprofiled {operators['unprofiled_update_s']:.2f} s); products by frozen weights "
          f"{operators['frozen_products_s']:.2f} s of the operators' {operators['operators_s']:.2f} s"
          + (f", {rate:.0f} GFLOP/s ({100 * rate / peak:.0f}% of peak)" if rate else ""))  # fmt: skip
    for op in operators["top_operators"][:6]:
        print(f"    {op['name'][:48]:48s} {op['self_s']:6.3f} s {op['calls']:6d} calls")
    print(f"  kernels: {describe_kernel_choices(result['kernel_choices'])}")


def plot(result: dict[str, Any], path: Path) -> None:
    """Seconds per step in each phase, with the products' share of the measured peak in the labels."""
    summary, dtype = result["summary"], result["settings"]["dtype"]
    peak = max(result["limits"]["products"][dtype].values())
    labels = []
    for phase in PHASES:
        rate = summary["product_gflops"].get(phase)
        name = phase.replace("generation/", "gen: ").replace("update/", "upd: ").replace("step/", "step: ")
        labels.append(f"{name}\n{100 * rate / peak:.0f}% of peak" if rate is not None else name)
    bar_chart(
        path,
        f"{result['machine']['cpu']}, {dtype}: {summary['step_s']:.2f} s a step (median)",
        labels,
        {"seconds per step": [summary["phases_s"][phase] for phase in PHASES]},
        "seconds",
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_arguments(parser)
    parser.add_argument("--steps", type=int, default=6, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps before them")
    parser.add_argument(
        "--bandwidth-mib", type=int, default=256, help="MiB read and copied for the bandwidth"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="tiny random model, 1 timed step: a smoke run")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help=f"where the JSON goes (default: {RESULTS_DIR}; with --quick, a new temporary directory)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup_steps, args.bandwidth_mib = 1, 1, 16
        args.max_completion_length = min(args.max_completion_length, 8)
    if args.output_dir is None:
        args.output_dir = Path(tempfile.mkdtemp(prefix="step_profile-quick-")) if args.quick else RESULTS_DIR
    args.allocator = "kept"  # make_ours reads it: what our trainer sets by default on a CPU
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    warnings.filterwarnings("ignore", category=UserWarning)
    llm_zoo.register(ENV_ID, WriteAboutEnv, description="benchmark-only: write about a topic", override=True)
    facts = run_facts(__file__, argv)
    facts["machine"]["cpu_flags"] = cpu_isa_flags()
    with tempfile.TemporaryDirectory(prefix="step_profile-") as tmp:
        measured = profile(args, Path(tmp))
    settings = {
        key: getattr(args, key)
        for key in ("model", "dtype", "steps", "warmup_steps", "prompts_per_step", "num_generations",
                    "max_completion_length", "micro_batch", "seed")
    }  # fmt: skip
    result = {
        **facts,
        "quick": args.quick,
        "settings": {**settings, "threads": torch.get_num_threads()},
        **measured,
    }
    print_summary(result)
    stem = result_stem(facts["machine"]["cpu"], "kept", args.dtype).replace(
        "trainer_vs_trl", "step_profile", 1
    )
    finish(result, args.output_dir / f"{stem}.json", lambda png: plot(result, png))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
