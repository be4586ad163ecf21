"""Cost of one decode step of the transformers engine's loop, side by side in one run.

At batch B (default 16) with a C-token context (default 556, a PlanPath prompt's length) on
SmolLM2-135M with a LoRA adapter (r=8 on q/k/v/o, non-zero weights), per dtype:

* ``dynamic``: transformers' ``DynamicLayer`` (keys and values appended with ``torch.cat``: the
  whole cache is re-copied every step), unmerged LoRA: the engine before issue 29;
* ``preallocated``: :class:`~llm_zoo_train.engines.hf.kv_buffer.PreallocatedLayer` (written in
  place), unmerged LoRA: the engine now;
* ``padded_sdpa`` and ``padded_shared_kv``: ``preallocated`` on a left-padded batch (every other
  row's first ``--padding`` positions masked, as batches of prompts of different lengths are), with
  transformers' ``sdpa`` (which copies every key/value head once per query head when a mask is
  given) against :data:`~llm_zoo_train.kernels.attention.SDPA_SHARED_KV` (reads them in place: the
  engine now); the step's logits are compared bit for bit;
* ``preallocated_merged``: the same with the adapter merged into the base weights
  (``merge_adapter``), plus the seconds one merge and one unmerge take, and how far the
  log-probabilities of the merged model are from the unmerged one (the update recomputes them
  unmerged; the trainer's ``logp_mismatch`` would grow by that much).

Steps are timed alternately (one of each per round) in CPU seconds of this process (one torch
thread, so the machine's load does not inflate them); medians are reported.

    python benchmarks/decode_step.py --dtype float32 bfloat16 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, DynamicCache

from llm_zoo_train.engines.hf.kv_buffer import preallocate
from llm_zoo_train.kernels.attention import register
from llm_zoo_train.models.policy import resolve_model_path


def prefilled(model, context: int, batch: int):
    ids = torch.randint(100, 10000, (1, context), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return ids, [
        (
            layer.keys.expand(batch, -1, -1, -1).contiguous(),
            layer.values.expand(batch, -1, -1, -1).contiguous(),
        )
        for layer in cache.layers
    ]


def step_seconds(
    model, layers, context: int, batch: int, steps: int, in_place: bool, padding: int = 0, logits=None
) -> list[float]:
    cache = DynamicCache(config=model.config)
    for index, (k, v) in enumerate(layers):
        cache.update(k.clone(), v.clone(), index)
    if in_place:
        assert preallocate(cache, steps)
    token = torch.full((batch, 1), 42)
    seconds = []
    for step in range(steps):
        length = context + step + 1
        mask = torch.ones((batch, length), dtype=torch.long)
        mask[::2, :padding] = 0
        positions = mask.sum(-1, keepdim=True) - 1
        start = time.process_time()
        with torch.no_grad():
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
        seconds.append(time.process_time() - start)
        if logits is not None:
            logits.append(out.logits)
    return seconds


def logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=556)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per timed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--padding", type=int, default=64, help="masked positions of the padded rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for dtype in args.dtype:
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(
            resolve_model_path(args.model), dtype=getattr(torch, dtype)
        )
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
        )
        model = get_peft_model(base, lora, adapter_name="policy").eval()
        with torch.no_grad():  # a trained-size adapter: small updates, not kaiming-sized ones
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.01)
        ids, layers = prefilled(model, args.context, args.batch)
        times: dict[str, list[float]] = {
            "dynamic": [], "preallocated": [], "padded_sdpa": [], "padded_shared_kv": [], "preallocated_merged": []
        }  # fmt: skip
        merge_s, unmerge_s = [], []
        padded_logits: dict[str, list[torch.Tensor]] = {"sdpa": [], "shared_kv": []}
        shape = (args.context, args.batch, args.steps)
        for _ in range(args.rounds):
            times["dynamic"] += step_seconds(model, layers, *shape, False)
            times["preallocated"] += step_seconds(model, layers, *shape, True)
            for name, implementation in (("sdpa", "sdpa"), ("shared_kv", register())):
                base.set_attn_implementation(implementation)
                times[f"padded_{name}"] += step_seconds(
                    model, layers, *shape, True, padding=args.padding, logits=padded_logits[name]
                )
            base.set_attn_implementation("sdpa")
            start = time.process_time()
            model.merge_adapter()
            merge_s.append(time.process_time() - start)
            times["preallocated_merged"] += step_seconds(
                model, layers, args.context, args.batch, args.steps, True
            )
            start = time.process_time()
            model.unmerge_adapter()
            unmerge_s.append(time.process_time() - start)
        sample = ids[:, :256]
        unmerged = logprobs(model, sample)
        model.merge_adapter()
        merged = logprobs(model, sample)
        model.unmerge_adapter()
        restored = (logprobs(model, sample) - unmerged).abs().max().item()
        gap = (merged - unmerged).abs()
        median = {name: statistics.median(values) for name, values in times.items()}
        print(f"{dtype}: batch {args.batch}, context {args.context}, {args.rounds} x {args.steps} steps each")
        for name, value in median.items():
            print(f"  {name:20s} {1000 * value:8.1f} ms/step  ({value / median['dynamic']:.2f} x dynamic)")
        same = all(
            torch.equal(a, b) for a, b in zip(padded_logits["sdpa"], padded_logits["shared_kv"], strict=True)
        )
        print(f"  padded: the shared-kv attention's logits equal sdpa's bit for bit: {same}")
        print(
            f"  merge {1000 * statistics.median(merge_s):.1f} ms, unmerge {1000 * statistics.median(unmerge_s):.1f} ms"
        )
        print(
            f"  logprob merged - unmerged over {sample.shape[1] - 1} tokens: max {gap.max().item():.2e}, "
            f"mean {gap.mean().item():.2e}; after unmerge: max {restored:.2e}"
        )


if __name__ == "__main__":
    main()
