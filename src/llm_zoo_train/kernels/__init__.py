"""CPU speed kernels: faster ways to run the policy's products and attention on a CPU.

The policy (:mod:`llm_zoo_train.models`) is a frozen base model with LoRA adapters; the modules
here make its forward and backward cheaper on a CPU, computing the same thing (the same bits, or
other float32 rounding where a choice says so). Each checks the device, dtype and shape it is given
and otherwise leaves the layer to transformers and peft. The packed products, the merged LoRA
weights and the grouped attention run on a CPU only; the lean LoRA forwards (``lora_inference``,
``lora_training``) run on any device where a probe gives peft's bits, and ``precision`` chooses
the attention for every device. Each module's docstring gives its measurements.

What each buys, and where:

* :mod:`~llm_zoo_train.kernels.packed_linear` (``rollout.decode_kernel``): a decode step's
  float32 products by weights packed once for MKL (same bits, checked; the Intel Xeon's choice)
  or for oneDNN (other rounding; on the AMD EPYC, where MKL is slow, a 576 x 1536 product at 16
  rows took 0.38 ms against ``F.linear``'s 0.68); in bfloat16, oneDNN's copies where a probe gives
  ``F.linear``'s bits (same tokens; a decode step's products at 16 rows 1.3x faster on the EPYC).
* :mod:`~llm_zoo_train.kernels.merged_lora`: where oneDNN's packed products run, each LoRA
  layer's merged weight packed too, so a decode layer is one product.
* :mod:`~llm_zoo_train.kernels.lora_inference`: peft's LoRA forward while generating, with less
  work around the two small products (same bits; an untrained adapter costs nothing).
* :mod:`~llm_zoo_train.kernels.frozen_linear` (``training.update_kernel``): the update's frozen
  float32 layers multiplied by oneDNN's packed copies, forward and input gradient (the EPYC).
* :mod:`~llm_zoo_train.kernels.lora_rank_rows` (``training.update_kernel``): the update's LoRA
  products with the rank as the rows, where MKL is slow at eight columns (the EPYC).
* :mod:`~llm_zoo_train.kernels.lora_training`: peft's LoRA forward in the update with the scaling
  and the sum folded into one ``addmm`` (same bits, probed per shape; every CPU).
* :mod:`~llm_zoo_train.kernels.lora_forward`: swapping a LoRA layer's ``forward`` for one block,
  shared by ``lora_inference``, ``lora_training`` and ``merged_lora``.
* :mod:`~llm_zoo_train.kernels.attention`: sdpa that reads grouped key/value heads in place while
  generating (same numbers), and a decode step's attention as grouped products where torch's
  kernel is slower (bfloat16 on the EPYC).
* :mod:`~llm_zoo_train.kernels.update_attention`: the update's attention as grouped products
  (eager attention without copying key/value heads) where torch's kernel measures slower: in
  bfloat16 on the AMD EPYC, a layer's forward and backward 8.2 -> 2.0 ms, the update 4.14 -> 3.66 s.
* :mod:`~llm_zoo_train.kernels.rollout_activations` (``training.rollout_activations_mb``): the
  update's completion and prompt passes take every linear layer's output from the rollout that
  sampled the tokens (same weights, on-policy) instead of multiplying by the frozen weights again
  (any device where it is on; by default a float32 model on a CPU).
* :mod:`~llm_zoo_train.kernels.precision`: which attention implementation a model runs and
  whether the CPU computes bfloat16 in hardware (AVX512-BF16, AMX).
* :mod:`~llm_zoo_train.kernels.choices`: the ``"auto"`` choices above are timed once per process;
  this is their record, which a checkpoint keeps so that a resumed run chooses as the first did.

The kernels sit below :mod:`llm_zoo_train.models` in the stages (``tests/test_layering.py``): the
policy and the engines use them; they import neither.
"""
