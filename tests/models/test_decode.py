"""Chunked prefill then plain one-token decode through the manager equals transformers' full forward."""
import torch

from hybridcache.models import load_model

from .helpers import Driver, reference_logits, save_tiny


def test_incremental_decode_matches_full_forward(tmp_path, device):
    path, hf = save_tiny(tmp_path, hybrid_override_pattern="M*-EM", chunk_size=4)
    model = load_model(path, device=device)
    g = torch.Generator().manual_seed(2)
    seqs = {"a": torch.randint(0, 96, (9 + 14,), generator=g), "b": torch.randint(0, 96, (5 + 14,), generator=g)}
    prompt = {"a": 9, "b": 5}
    refs = {r: reference_logits(hf, s) for r, s in seqs.items()}
    a, b = seqs["a"].tolist(), seqs["b"].tolist()
    drv = Driver(model, device=device)

    # a's prompt in two chunks; b's in one, in the same step as a's second chunk
    drv.mgr.add_request("a")
    (first,) = drv.step([("a", a[:4])])
    drv.accept()
    drv.mgr.add_request("b")
    second, whole_b = drv.step([("a", a[4:9]), ("b", b[:5])])
    drv.accept()
    torch.testing.assert_close(torch.cat([first, second]), refs["a"][:9], atol=1e-4, rtol=0)
    torch.testing.assert_close(whole_b, refs["b"][:5], atol=1e-4, rtol=0)
    drv.mgr.start_generation("a")
    drv.mgr.start_generation("b")

    for i in range(14):
        pos = {r: prompt[r] + i for r in seqs}
        rows = [(r, [seqs[r][pos[r]].item()]) for r in seqs]
        got = drv.step([], rows, speculative=False)
        drv.accept([1, 1])
        for (r, _), logits in zip(rows, got):
            torch.testing.assert_close(logits[0], refs[r][pos[r]], atol=1e-4, rtol=0, msg=f"{r} at {pos[r]}")
