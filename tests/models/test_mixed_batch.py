"""One forward mixing context rows and generation rows equals running them in separate forwards."""
import pytest
import torch

from hybridcache.models import load_model

from .helpers import Driver, reference_logits, save_tiny


@pytest.mark.parametrize("speculative", [False, True], ids=["decode", "verify"])
def test_mixed_batch_equals_separate_forwards(tmp_path, speculative, device):
    path, hf = save_tiny(tmp_path, hybrid_override_pattern="ME*M-", chunk_size=4)
    model = load_model(path, device=device)
    g = torch.Generator().manual_seed(4)
    seqs = {r: torch.randint(0, 96, (24,), generator=g).tolist() for r in "abcd"}
    refs = {r: reference_logits(hf, torch.tensor(s)) for r, s in seqs.items()}
    k = 3 if speculative else 0
    steps = k + 1
    valid = [2, 3] if speculative else [1, 1]

    def warm_up() -> Driver:
        drv = Driver(model, num_draft_tokens=k, num_slots=5, device=device)
        drv.prefill({"a": seqs["a"][:8], "b": seqs["b"][:5]})
        drv.mgr.add_request("c")
        drv.step([("c", seqs["c"][:4])])
        drv.accept()
        drv.mgr.add_request("d")
        return drv

    context = [("c", seqs["c"][4:9]), ("d", seqs["d"][:6])]
    generation = [("a", seqs["a"][8 : 8 + steps]), ("b", seqs["b"][5 : 5 + steps])]

    mixed = warm_up()
    mixed_out = mixed.step(context, generation, speculative)
    mixed.accept([5, 6, *valid])

    apart = warm_up()
    apart_out = apart.step(context)
    apart.accept()
    apart_out += apart.step([], generation, speculative)
    apart.accept(valid)

    for got, want in zip(mixed_out, apart_out):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed_out[0], refs["c"][4:9], atol=1e-4, rtol=0)
    torch.testing.assert_close(mixed_out[2][: valid[0]], refs["a"][8 : 8 + valid[0]], atol=1e-4, rtol=0)

    # the states both runs left behind serve the next step alike
    pos = {"a": 8 + valid[0], "b": 5 + valid[1], "c": 9, "d": 6}
    after = []
    for drv in (mixed, apart):
        for r in "cd":
            drv.mgr.start_generation(r)
        rows = [(r, seqs[r][p : p + steps]) for r, p in pos.items()]
        after.append(drv.step([], rows, speculative))
        drv.accept([1] * 4)
    for r, got, want in zip(pos, *after):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got[0], refs[r][pos[r]], atol=1e-4, rtol=0, msg=r)


def test_step_kind_must_match_the_state_roles(tmp_path):
    path, _ = save_tiny(tmp_path)
    model = load_model(path)
    for k, speculative, message in [(0, True, "replay roles"), (3, False, "speculative=True")]:
        drv = Driver(model, num_draft_tokens=k)
        drv.prefill({"a": [5, 6, 7]})
        with pytest.raises(ValueError, match=message):
            drv.step([], [("a", [8])], speculative)
        drv.mgr.abort_step()
