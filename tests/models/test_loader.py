"""Loader: typed errors that name the problem, sharded and renamed checkpoints, tokenizer, default checkpoint."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridcache.models import (
    MissingTensorError,
    ModelLoadError,
    TensorShapeError,
    UnsupportedConfigError,
    UnsupportedModelTypeError,
    load_model,
    load_tokenizer,
)
from hybridcache.models.default import build_default_checkpoint

from .helpers import Driver, reference_logits, save_tiny


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def _same_weights(a, b):
    ta, tb = a.tensor_targets(), b.tensor_targets()
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


@pytest.fixture
def tiny(tmp_path):
    path, _ = save_tiny(tmp_path / "tiny")
    return path


def test_unsupported_model_type_lists_the_supported(tiny):
    _edit_config(tiny, model_type="llama")
    with pytest.raises(UnsupportedModelTypeError, match=r"'llama'.*supported: .*nemotron_h") as e:
        load_model(tiny)
    assert isinstance(e.value, ModelLoadError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("name", ["backbone.layers.0.mixer.dt_bias", "backbone.layers.3.mixer.experts.2.up_proj.weight",
                                  "lm_head.weight"])
def test_missing_tensor_is_named(tiny, name):
    _edit_tensors(tiny, lambda t: t.pop(name))
    with pytest.raises(MissingTensorError, match=name.replace(".", r"\.")):
        load_model(tiny)


def test_misshaped_tensor_names_expected_and_got(tiny):
    name = "backbone.layers.1.mixer.k_proj.weight"
    _edit_tensors(tiny, lambda t: t.__setitem__(name, torch.zeros(16, 31)))
    with pytest.raises(TensorShapeError, match=r"k_proj\.weight.*\[16, 31\], expected \[16, 32\]"):
        load_model(tiny)


@pytest.mark.parametrize("changes, field", [
    (dict(mamba_hidden_act="gelu"), "mamba_hidden_act"),
    (dict(sliding_window=8), "sliding_window"),
    (dict(n_groups=3), "n_groups"),
    (dict(mlp_hidden_act="swish_cubed"), "mlp_hidden_act"),
    (dict(layers_block_type=["linear_attention", "cross_attention"]), "layers_block_type"),
    (dict(hidden_size=0), "hidden_size"),
])
def test_config_the_model_cannot_serve(tiny, changes, field):
    _edit_config(tiny, **changes)
    with pytest.raises(UnsupportedConfigError, match=field):
        load_model(tiny)


def test_directory_without_config_or_weights(tmp_path, tiny):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)
    (tiny / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(tiny)


def test_sharded_checkpoint_loads_identically(tmp_path):
    path, hf = save_tiny(tmp_path / "one")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    shards = list((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    _same_weights(load_model(path), load_model(tmp_path / "sharded"))


def test_model_prefix_and_legacy_pattern_load_identically(tiny, tmp_path):
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    tensors = load_file(tiny / "model.safetensors")
    save_file({k.replace("backbone.", "model.", 1): v for k, v in tensors.items()}, renamed / "model.safetensors")
    config = json.loads((tiny / "config.json").read_text())
    config.pop("layers_block_type")
    config["hybrid_override_pattern"] = "M*-E"
    (renamed / "config.json").write_text(json.dumps(config))
    _same_weights(load_model(tiny), load_model(renamed))


def test_tokenizer_only_when_the_directory_has_one(tiny):
    assert load_tokenizer(tiny) is None
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(tiny)
    assert load_tokenizer(tiny)("hello world")["input_ids"] == [1, 2]


def test_default_checkpoint_is_deterministic_and_matches_transformers(tmp_path):
    from transformers import NemotronHForCausalLM

    first, second = build_default_checkpoint(tmp_path / "a"), build_default_checkpoint(tmp_path / "b")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    model = load_model(first)
    spec = model.spec
    assert spec.count("M") >= 2 and spec.count("*") >= 1
    hf = NemotronHForCausalLM.from_pretrained(first).eval()
    prompt = torch.arange(3, 40) % spec.vocab_size
    (got,) = Driver(model).prefill({"a": prompt.tolist()})
    want = reference_logits(hf, prompt)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    top2 = want.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).median()) > 1e-2  # greedy choices are not near-ties
