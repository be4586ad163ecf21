"""Token log-probabilities and entropies computed a few positions at a time
(llm_zoo_train.training.token_logprobs): the same bits as the plain torch formulation, forward and
backward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from llm_zoo_train.training.token_logprobs import ROWS_PER_BLOCK, token_entropy, token_logprobs  # noqa: E402


def plain(logits, targets, weights):
    """The formulation the blocks replace: gather - logsumexp, softmax for the entropy."""
    log_normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_normalizer
    with torch.no_grad():
        entropy = log_normalizer - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    (grad,) = torch.autograd.grad((logprobs * weights).sum(), logits)
    return logprobs.detach(), entropy, grad


def blocked(logits, targets, weights):
    logprobs, log_normalizer = token_logprobs(logits, targets)
    entropy = token_entropy(logits, log_normalizer)
    (grad,) = torch.autograd.grad((logprobs * weights).sum(), logits)
    return logprobs.detach(), entropy, grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 37, 1000), (1, 1, 50), (2, ROWS_PER_BLOCK, 257)])
def test_the_same_bits_as_gather_minus_logsumexp(dtype, shape):
    generator = torch.Generator().manual_seed(sum(shape))
    logits = (torch.randn(*shape, generator=generator, dtype=dtype) * 4).requires_grad_()
    targets = torch.randint(0, shape[-1], shape[:2], generator=generator)
    weights = torch.randn(shape[:2], generator=generator, dtype=dtype)  # a mask x advantage stand-in
    weights[0, 0] = 0.0
    for expected, got in zip(plain(logits, targets, weights), blocked(logits, targets, weights), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)


def test_extreme_logits_stay_finite_like_the_plain_formulation():
    logits = torch.tensor([[[1e4, -1e4, 0.0], [-float("inf"), 0.0, 1.0]]], requires_grad=True)
    targets = torch.tensor([[1, 2]])
    weights = torch.ones(1, 2)
    for expected, got in zip(plain(logits, targets, weights), blocked(logits, targets, weights), strict=True):
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))


def test_gradient_flows_through_a_projection():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 20, 16, generator=generator, requires_grad=True)
    head = torch.randn(300, 16, generator=generator)
    targets = torch.randint(0, 300, (2, 20), generator=generator)
    logprobs, _ = token_logprobs(hidden @ head.T, targets)
    logprobs.sum().backward()
    reference = hidden.detach().clone().requires_grad_()
    logits = reference @ head.T
    (logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)).sum().backward()
    assert torch.equal(hidden.grad, reference.grad)
