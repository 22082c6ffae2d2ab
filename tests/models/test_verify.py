"""Speculative verify steps (k = 3, T = 4) with random acceptance give the full forward's logits.

Each step feeds the true token at the committed position, then the true continuation up to the accepted
count `v`, then (half the time) wrong drafts that must leave no trace. The test mirrors the layout's
PNAT / fold rule, checks the pool's bookkeeping against it and requires several folds (buffer flips).
A suspend / resume moves one request to another slot mid-way.
"""
import torch

from hybridcache.models import load_model

from .helpers import Driver, reference_logits, save_tiny

K, T, STEPS = 3, 4, 24


def test_verify_with_random_acceptance_matches_full_forward(tmp_path, device):
    path, hf = save_tiny(tmp_path, hybrid_override_pattern="M*EM-", chunk_size=4, n_groups=2)
    model = load_model(path, device=device)
    g = torch.Generator().manual_seed(3)
    prompt = {"a": 7, "b": 10}
    seqs = {r: torch.randint(0, 96, (n + STEPS * T + T,), generator=g) for r, n in prompt.items()}
    refs = {r: reference_logits(hf, s) for r, s in seqs.items()}
    drv = Driver(model, num_draft_tokens=K, device=device)
    hist = drv.mgr.states[0].hist
    drv.prefill({r: seqs[r][:n].tolist() for r, n in prompt.items()})

    pos = dict(prompt)
    pnat = {r: 0 for r in seqs}
    folds = 0
    for step in range(STEPS):
        valid = {r: int(torch.randint(1, T + 1, (1,), generator=g)) for r in seqs}
        rows = []
        for r in seqs:
            tokens = seqs[r][pos[r] : pos[r] + T].clone()
            if torch.rand(1, generator=g) < 0.5:
                wrong = torch.randint(0, 96, (T,), generator=g)
                tokens[valid[r]:] = torch.where(wrong == tokens, (wrong + 1) % 96, wrong)[valid[r]:]
            rows.append((r, tokens.tolist()))
        got = drv.step([], rows, speculative=True)
        for (r, _), logits in zip(rows, got):
            v = valid[r]
            torch.testing.assert_close(logits[:v], refs[r][pos[r] : pos[r] + v], atol=1e-4, rtol=0,
                                       msg=f"step {step}, request {r}, v={v}")
        drv.accept([valid[r] for r in seqs])
        for r in seqs:
            folded = pnat[r] + T > hist
            folds += folded
            pnat[r] = valid[r] if folded else pnat[r] + valid[r]
            pos[r] += valid[r]
            slot = drv.mgr.entry(r).slot
            assert int(drv.mgr.state_tensors("mamba2")["pnat"][0, slot]) == pnat[r]

        if step == STEPS // 2:  # move "a" to another slot; a newcomer takes (and zeroes) its old one
            old = drv.mgr.entry("a").slot
            drv.mgr.suspend(["a"])
            drv.mgr.add_request("filler")
            drv.mgr.prepare_step(["filler"], [3])
            drv.accept()
            drv.mgr.resume(["a"])
            assert drv.mgr.entry("a").slot != old
            drv.mgr.free("filler")
            drv.mgr.check_integrity()
    assert folds >= 3
