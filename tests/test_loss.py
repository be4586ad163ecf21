"""The policy loss and token logprobs (llm_zoo_train.training.loss) against hand-computed values.

The fixed batch: 3 sequences, width 3, advantages (+1, -2, -1), clip range [0.8, 1.28]
(epsilon 0.2, epsilon_high 0.28). Per token the ratio r = exp(logp - old) and the loss is
-min(r A, clip(r) A):

    row 0 (A=+1): r = 1, e^-0.2, e^0.4   -> -1, -e^-0.2, -1.28 (clipped high)
    row 1 (A=-2): r = e^0.3, 1, [pad]    -> 2 e^0.3 (not clipped: the min keeps r A), 2
    row 2 (A=-1): r = 0.7, 1, [pad]      -> 0.8 (clipped low), 1

Padding positions hold junk values that must not matter.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.training.loss import completion_logprobs, policy_loss  # noqa: E402

JUNK = 5.0
LOGP = [[-1.0, -2.0, -0.5], [-0.2, -1.5, JUNK], [-1.0 + math.log(0.7), -0.7, JUNK]]
OLD = [[-1.0, -1.8, -0.9], [-0.5, -1.5, -JUNK], [-1.0, -0.7, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 0]]
ADVANTAGES = [1.0, -2.0, -1.0]
PER_TOKEN = [[-1.0, -math.exp(-0.2), -1.28], [2 * math.exp(0.3), 2.0], [0.8, 1.0]]
TOKENS = 7
ROW_MEANS = [sum(row) / len(row) for row in PER_TOKEN]
TOTAL = sum(sum(row) for row in PER_TOKEN)
CLIP = dict(epsilon=0.2, epsilon_high=0.28)


def batch(requires_grad=False):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=requires_grad)
    return (
        logp,
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(ADVANTAGES, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", sum(ROW_MEANS) / 3),
        ("bnpo", TOTAL / TOKENS),
        ("dapo", TOTAL / TOKENS),
        ("dr_grpo", TOTAL / (3 * 4)),
    ],
)
def test_loss_types_by_hand(loss_type, expected):
    loss, metrics = policy_loss(*batch(), loss_type=loss_type, max_completion_length=4, **CLIP)
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    assert metrics["clip_fraction_low"] == pytest.approx(1 / TOKENS)  # row 2, token 0
    assert metrics["clip_fraction_high"] == pytest.approx(1 / TOKENS)  # row 0, token 2
    assert metrics["clip_fraction"] == pytest.approx(2 / TOKENS)
    assert metrics["ratio_min"] == pytest.approx(0.7)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.4))
    ratios = [1, math.exp(-0.2), math.exp(0.4), math.exp(0.3), 1, 0.7, 1]
    assert metrics["ratio_mean"] == pytest.approx(sum(ratios) / TOKENS)
    assert "kl" not in metrics and "logp_mismatch" not in metrics


def test_the_numbers_above_are_what_they_say():
    # A guard on the hand computation itself: grpo averages rows, dapo averages tokens.
    assert sum(ROW_MEANS) / 3 == pytest.approx(
        ((-1 - math.exp(-0.2) - 1.28) / 3 + (2 * math.exp(0.3) + 2) / 2 + 0.9) / 3
    )
    assert pytest.approx(-1 - math.exp(-0.2) - 1.28 + 2 * math.exp(0.3) + 2 + 0.8 + 1) == TOTAL


def test_symmetric_clip_when_epsilon_high_is_none():
    loss, metrics = policy_loss(*batch(), loss_type="bnpo", epsilon=0.2)
    # Only row 0 token 2 changes: clipped at 1.2 instead of 1.28.
    assert float(loss) == pytest.approx((TOTAL + 1.28 - 1.2) / TOKENS)
    assert metrics["clip_fraction_high"] == pytest.approx(1 / TOKENS)


def test_gradient_is_zero_exactly_on_clipped_tokens():
    logp, old, advantages, mask = batch(requires_grad=True)
    loss, _ = policy_loss(logp, old, advantages, mask, loss_type="dapo", **CLIP)
    loss.backward()
    # d/dlogp of -r A is -A r where unclipped, 0 where the clipped branch is the min, 0 on padding.
    expected = [
        [-1.0 / TOKENS, -math.exp(-0.2) / TOKENS, 0.0],
        [2 * math.exp(0.3) / TOKENS, 2.0 / TOKENS, 0.0],
        [0.0, 1.0 / TOKENS, 0.0],
    ]
    assert logp.grad.tolist() == [pytest.approx(row) for row in expected]


def test_dapo_normalises_by_the_global_token_count_when_given():
    loss, _ = policy_loss(*batch(), loss_type="dapo", total_tokens=20, **CLIP)
    assert float(loss) == pytest.approx(TOTAL / 20)


def test_k3_kl_to_the_reference_with_beta():
    deltas = [[0.0, 0.5, -0.5], [1.0, 0.0, 9.0], [0.2, -0.1, 9.0]]  # ref - logp (junk on padding)
    logp, old, advantages, mask = batch()
    ref = logp + torch.tensor(deltas, dtype=torch.float64)
    kl = [
        [math.exp(d) - d - 1 for d, m in zip(row, mrow, strict=True) if m]
        for row, mrow in zip(deltas, MASK, strict=True)
    ]
    kl_total = sum(sum(row) for row in kl)
    loss, metrics = policy_loss(
        logp, old, advantages, mask, loss_type="dapo", beta=0.1, ref_logprobs=ref, **CLIP
    )
    assert float(loss) == pytest.approx((TOTAL + 0.1 * kl_total) / TOKENS)
    assert metrics["kl"] == pytest.approx(kl_total / TOKENS)
    grpo, _ = policy_loss(logp, old, advantages, mask, loss_type="grpo", beta=0.1, ref_logprobs=ref, **CLIP)
    rows = [(sum(p) + 0.1 * sum(k)) / len(p) for p, k in zip(PER_TOKEN, kl, strict=True)]
    assert float(grpo) == pytest.approx(sum(rows) / 3)
    # beta 0 with a reference: the KL is reported, not added.
    plain, metrics = policy_loss(logp, old, advantages, mask, loss_type="dapo", ref_logprobs=ref, **CLIP)
    assert float(plain) == pytest.approx(TOTAL / TOKENS) and metrics["kl"] == pytest.approx(kl_total / TOKENS)


def test_truncated_importance_sampling():
    logp, old, advantages, mask = batch()
    shifts = [[-math.log(2), 0.0, math.log(2)], [0.0, 0.0, 0.0], [math.log(4), 0.0, 0.0]]
    behaviour = old + torch.tensor(shifts, dtype=torch.float64)  # weight = exp(old - behaviour)
    weights = [[min(2.0, 1.5), 1.0, 0.5], [1.0, 1.0], [0.25, 1.0]]
    expected = (
        sum(
            p * w
            for prow, wrow in zip(PER_TOKEN, weights, strict=True)
            for p, w in zip(prow, wrow, strict=True)
        )
        / TOKENS
    )
    loss, metrics = policy_loss(
        logp,
        old,
        advantages,
        mask,
        loss_type="dapo",
        behaviour_logprobs=behaviour,
        importance_sampling_cap=1.5,
        **CLIP,
    )
    assert float(loss) == pytest.approx(expected)
    assert metrics["is_weight_mean"] == pytest.approx((1.5 + 1 + 0.5 + 1 + 1 + 0.25 + 1) / TOKENS)
    assert metrics["is_capped_fraction"] == pytest.approx(1 / TOKENS)
    # |old - behaviour| = |shift| on the real tokens (not |logp - behaviour|: drift is not mismatch).
    mismatch = [
        abs(s) for srow, mrow in zip(shifts, MASK, strict=True) for s, m in zip(srow, mrow, strict=True) if m
    ]
    assert metrics["logp_mismatch"] == pytest.approx(sum(mismatch) / TOKENS)
    # Without a cap the behaviour logprobs only feed the mismatch metric.
    uncorrected, metrics = policy_loss(logp, old, advantages, mask, behaviour_logprobs=behaviour, **CLIP)
    assert float(uncorrected) == pytest.approx(TOTAL / TOKENS) and "is_weight_mean" not in metrics


def test_per_token_advantages_broadcast_the_same_as_per_sequence():
    logp, old, advantages, mask = batch()
    per_token = advantages.unsqueeze(1).expand(-1, 3)
    assert float(policy_loss(logp, old, per_token, mask, **CLIP)[0]) == pytest.approx(TOTAL / TOKENS)


def test_bad_arguments_are_clear_errors():
    logp, old, advantages, mask = batch()
    with pytest.raises(ValueError, match="grpo, dr_grpo, dapo, bnpo"):
        policy_loss(logp, old, advantages, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(logp, old, advantages, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, advantages, mask, beta=0.1)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_loss(logp, old, advantages, mask, importance_sampling_cap=2.0)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(logp, old[:2], advantages, mask)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, advantages[:2], mask)


# ---------------------------------------------------------------------- completion_logprobs


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def reference_logprobs(model, prompt, completion, temperature):
    """One unpadded forward per sequence, scored by hand."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    rows = range(len(prompt) - 1, len(prompt) + len(completion) - 1)
    tokens = [logprobs[r, t].item() for r, t in zip(rows, completion, strict=True)]
    entropy = [-(logprobs[r].exp() * logprobs[r]).sum().item() for r in rows]
    return tokens, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_completion_logprobs_match_unpadded_forwards(model, temperature):
    prompts = [[1, 50, 60, 70, 2], [1, 80], [1, 90, 91]]
    completions = [[10, 11, 12], [13, 14, 15, 16, 17], [2]]
    logprobs, mask, entropy = completion_logprobs(
        model, prompts, completions, pad_token_id=0, temperature=temperature, with_entropy=True
    )
    assert logprobs.shape == mask.shape == entropy.shape == (3, 5)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        expected, expected_entropy = reference_logprobs(model, prompt, completion, temperature)
        n = len(completion)
        assert mask[row].tolist() == [1.0] * n + [0.0] * (5 - n)
        assert logprobs[row, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert entropy[row, :n].tolist() == pytest.approx(expected_entropy, abs=1e-5)
        assert logprobs[row, n:].abs().sum() == 0


def test_completion_logprobs_carry_gradients_and_handle_empty_completions(model):
    logprobs, mask, entropy = completion_logprobs(model, [[1, 5], [1, 6, 7]], [[8, 9], []], pad_token_id=0)
    assert entropy is None and mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()
    empty, empty_mask, _ = completion_logprobs(model, [[1]], [[]], pad_token_id=0)
    assert empty.shape == empty_mask.shape == (1, 0)
    with pytest.raises(ValueError, match="at least one token"):
        completion_logprobs(model, [[]], [[3]], pad_token_id=0)


def test_rows_sharing_a_prompt_match_separate_forwards(tiny_model_dir, monkeypatch):
    """A GRPO group's rows share one pass over their prompt: same logprobs, entropies and LoRA
    gradients as one full forward per row."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    import llm_zoo_train.training.loss as loss_module

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    prompts = [[1, 50, 60], [1, 50, 60], [1, 80], [1, 50, 60], [1, 80], [1, 90, 91, 92]]
    completions = [[10, 11, 12], [13], [14, 15], [], [16, 17, 18, 19], [20, 21]]
    shared_calls = []
    real = loss_module._logits_with_shared_prompts
    monkeypatch.setattr(
        loss_module,
        "_logits_with_shared_prompts",
        lambda *a, **k: shared_calls.append(1) or real(*a, **k),
    )

    def run():
        model.zero_grad()
        logprobs, mask, entropy = loss_module.completion_logprobs(
            model, prompts, completions, pad_token_id=0, temperature=0.7, with_entropy=True
        )
        logprobs.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return logprobs.detach(), mask, entropy, grads

    shared = run()
    assert shared_calls == [1]
    monkeypatch.setattr(loss_module, "_can_share_prompts", lambda model: False)
    separate = run()
    assert shared_calls == [1]
    assert torch.equal(shared[1], separate[1])
    torch.testing.assert_close(shared[0], separate[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[2], separate[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[3], separate[3], atol=1e-5, rtol=1e-4)
    assert shared[3].abs().sum() > 0


def test_shared_prompt_logits_are_scored_in_pieces_with_the_bits_of_the_joined_logits(model, monkeypatch):
    """The shared-prompt path scores the prompt pass's logits and the completion pass's apart (no
    copy of every logit into one tensor): logprobs, entropies and the logits' gradients are the
    bits that scoring the joined logits gives."""
    import llm_zoo_train.training.loss as loss_module
    from llm_zoo_train.training.token_logprobs import token_entropy, token_logprobs

    scored = []
    monkeypatch.setattr(
        loss_module,
        "token_logprobs",
        lambda logits, targets: scored.append((logits, targets)) or token_logprobs(logits, targets),
    )
    prompts = [[1, 50, 60], [1, 50, 60], [1, 80], [1, 80]]
    completions = [[10, 11, 12], [13, 14], [15, 16, 17, 18], [19]]
    logprobs, mask, entropy = loss_module.completion_logprobs(
        model, prompts, completions, pad_token_id=0, temperature=0.7, with_entropy=True
    )
    assert [logits.shape[1] for logits, _ in scored] == [1, 3]  # the prompt pass, then the rest
    pieces = [logits for logits, _ in scored]
    joined_logprobs, joined_normalizer = token_logprobs(
        torch.cat(pieces, dim=1), torch.cat([targets for _, targets in scored], dim=1)
    )
    joined_entropy = token_entropy(torch.cat(pieces, dim=1), joined_normalizer)
    assert torch.equal(logprobs, joined_logprobs * mask)
    assert torch.equal(entropy, joined_entropy * mask)
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(0))
    apart = torch.autograd.grad((logprobs * weights).sum(), pieces, retain_graph=True)
    joined = torch.autograd.grad((joined_logprobs * mask * weights).sum(), pieces)
    assert all(torch.equal(a, b) for a, b in zip(apart, joined, strict=True))
    assert all(grad.abs().sum() > 0 for grad in apart)
