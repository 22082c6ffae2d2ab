"""A workload that arrives while the engine runs: what the pressure tests share."""
from __future__ import annotations

import random

from hybridcache import LLM, SamplingParams


def run_with_arrivals(llm: LLM, prompts: list[list[int]], params: list[SamplingParams],
                      seed: int) -> tuple[list[list[int]], int]:
    """Add 0-2 prompts before each step and, with probability 0.15, rebalance to 2, 3 or 4 slots (refusals,
    ValueError, are skipped), with `check_integrity()` before each step, until every request is done.
    Returns the outputs' tokens in prompt order and the number of rebalances made."""
    rng = random.Random(seed)
    pending, ids, outputs, rebalances = list(range(len(prompts))), {}, {}, 0
    while pending or llm.has_unfinished():
        for _ in range(rng.randint(0, 2)):
            if pending:
                i = pending.pop(0)
                ids[llm.add_request(prompts[i], params[i])] = i
        if rng.random() < 0.15:
            try:
                llm.rebalance(rng.choice([2, 3, 4]))
                rebalances += 1
            except ValueError:
                pass  # that many slots leave no room for one page
        llm.manager.check_integrity()
        for out in llm.step():
            outputs[ids[out.request_id]] = out.token_ids
    return [outputs[i] for i in range(len(prompts))], rebalances
