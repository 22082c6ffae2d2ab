"""Loader failures, each from a tiny checkpoint corrupted one way: a typed ModelLoadError naming the file or
the tensor, never a raw JSONDecodeError or SafetensorError, and never weights that load as garbage."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridcache.models import ModelLoadError, UnsupportedModelTypeError, load_model, load_tokenizer
from hybridcache.models.errors import CheckpointFileError, NonFiniteTensorError, TensorDtypeError

from .helpers import save_tiny

NAME = "backbone.layers.0.mixer.in_proj.weight"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("pristine"))
    return {f.name: f.read_bytes() for f in path.iterdir()}


@pytest.fixture
def tiny(tmp_path, pristine):
    """A fresh copy of the tiny checkpoint for one test to corrupt."""
    for name, data in pristine.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _edit_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def _load_error(path, cls=ModelLoadError, **kwargs):
    with pytest.raises(cls) as e:
        load_model(path, **kwargs)
    assert "\n" not in str(e.value)
    return e.value


def test_the_pristine_copy_loads(tiny):
    load_model(tiny)


@pytest.mark.parametrize("corrupt", [
    lambda b: b[: len(b) // 2],                      # truncated mid-data
    lambda b: b[:5],                                 # shorter than the header length
    lambda b: b"\xff" * 64,                          # header length past the end
    lambda b: (9).to_bytes(8, "little") + b"{not json" + b[17:],  # header that is not JSON
], ids=["truncated", "tiny", "huge-header", "bad-header"])
def test_corrupt_safetensors_names_the_file(tiny, corrupt):
    file = tiny / "model.safetensors"
    file.write_bytes(corrupt(file.read_bytes()))
    err = _load_error(tiny, CheckpointFileError)
    assert err.file == str(file) and "model.safetensors" in str(err)


@pytest.mark.parametrize("text", ["{", "[1, 2]", "\xff\xfe"], ids=["truncated", "not-object", "not-utf8"])
def test_bad_config_json_names_the_file(tiny, text):
    (tiny / "config.json").write_bytes(text.encode("latin-1"))
    err = _load_error(tiny, CheckpointFileError)
    assert err.file == str(tiny / "config.json")


@pytest.mark.parametrize("text", ['{"weight_map": ', '{"weight_map": [1]}', '{"weight_map": {"a": 3}}'],
                         ids=["truncated", "list", "not-a-file-name"])
def test_bad_index_json_names_the_file(tiny, text):
    (tiny / "model.safetensors.index.json").write_text(text)
    err = _load_error(tiny, CheckpointFileError)
    assert err.file == str(tiny / "model.safetensors.index.json")


def test_index_naming_a_file_without_the_tensor(tiny):
    tensors = load_file(tiny / "model.safetensors")
    weight_map = {name: "model.safetensors" for name in tensors}
    weight_map[NAME] = "other.safetensors"
    save_file({"unrelated": torch.zeros(1)}, tiny / "other.safetensors")
    (tiny / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    err = _load_error(tiny, CheckpointFileError)
    assert "other.safetensors" in str(err) and NAME in str(err)


def test_missing_directory_and_missing_config(tmp_path):
    assert "not a checkpoint directory" in str(_load_error(tmp_path / "nowhere"))
    assert "has no config.json" in str(_load_error(tmp_path))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weight_is_named(tiny, value):
    _edit_tensors(tiny, lambda t: t[NAME].view(-1).__setitem__(3, value))
    err = _load_error(tiny, NonFiniteTensorError)
    assert err.name == NAME and err.count == 1 and "in the checkpoint" in str(err)


def test_overflow_in_the_cast_is_named(tiny):
    _edit_tensors(tiny, lambda t: t[NAME].view(-1).__setitem__(0, 1e6))
    load_model(tiny)  # finite in float32
    err = _load_error(tiny, NonFiniteTensorError, dtype=torch.float16)
    assert err.name == NAME and "float16" in str(err)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_non_float_weight_is_refused(tiny, dtype):
    _edit_tensors(tiny, lambda t: t.__setitem__(NAME, t[NAME].to(dtype)))
    err = _load_error(tiny, TensorDtypeError)
    assert err.name == NAME and str(dtype) in str(err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_load(tiny, dtype):
    _edit_tensors(tiny, lambda t: t.__setitem__(NAME, t[NAME].to(dtype)))
    load_model(tiny)


@pytest.mark.parametrize("model_type", ["llama", None, 3])
def test_unsupported_model_type_lists_the_supported(tiny, model_type):
    config = json.loads((tiny / "config.json").read_text())
    config["model_type"] = model_type
    (tiny / "config.json").write_text(json.dumps(config))
    err = _load_error(tiny, UnsupportedModelTypeError)
    assert "nemotron_h" in str(err) and "qwen3_next" in str(err) and "kimi_linear" in str(err)


def test_bad_tokenizer_file_is_a_model_load_error(tiny):
    (tiny / "tokenizer.json").write_text("{")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_tokenizer(tiny)


def test_a_bad_generation_config_is_a_checkpoint_file_error(tmp_path):
    from hybridcache import LLM
    from hybridcache.models.errors import CheckpointFileError

    path, _ = save_tiny(tmp_path)
    (path / "generation_config.json").write_text("{not json")
    with pytest.raises(CheckpointFileError, match="generation_config.json"):
        LLM(path)
