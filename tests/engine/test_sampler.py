import pytest
import torch

from hybridcache.engine.params import SamplingParams
from hybridcache.engine.sampler import choose, probabilities


def test_greedy_accepts_the_matching_prefix_and_adds_the_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    greedy = SamplingParams(temperature=0.0)
    assert choose(logits, [1, 0], greedy, None) == [1, 0, 2]
    assert choose(logits, [1, 2], greedy, None) == [1, 0]
    assert choose(logits, [2, 0], greedy, None) == [1]
    assert choose(logits[:1], [], greedy, None) == [1]


def test_top_k_and_top_p_truncate():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.9))
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)


@pytest.mark.parametrize("draft", [0, 2, 3])
def test_rejection_sampling_keeps_the_target_distribution(draft):
    """The first emitted token of a verify step is distributed as plain sampling would draw it."""
    target = torch.tensor([0.1, 0.2, 0.6, 0.1])
    logits = torch.log(target)[None].repeat(2, 1)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(4)
    for _ in range(n):
        counts[choose(logits, [draft], params, gen)[0]] += 1
    assert torch.allclose(counts / n, target, atol=0.015), (counts / n).tolist()
