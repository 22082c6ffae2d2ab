"""Every user mistake on the command line: one line on stderr, exit code 2, no traceback, and (for the
parameters) refused before any model loads."""
import json

import pytest
import torch

from hybridcache import cli
from hybridcache.cli import main
from tests.models.helpers import save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tiny):
    path = tmp_path_factory.mktemp("llama")
    config = json.loads((tiny / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    return path


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """`generate` sets one thread for the tiny model; the tests after this module keep their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a model would load: parameter mistakes are caught before."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the mistake was caught")

    monkeypatch.setattr("hybridcache.engine.llm.load_model", refuse)
    monkeypatch.setattr("hybridcache.models.loader.load_model", refuse)


def _one_line_error(capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and "error: " in err, err
    return err


GEN = ["generate", "--model", "{tiny}"]
CUDA = [] if torch.cuda.is_available() else [(GEN + ["--token-ids", "1", "--device", "cuda"], "CUDA is not available")]

# the table, then the rest of the surface; "{tiny}" / "{llama}" / "{empty}" are checkpoint dirs
MISTAKES = [
    (["generate", "--model", "{empty}", "--token-ids", "1"], "has no config.json"),
    (GEN + ["--token-ids", "1", "--max-tokens", "-5"], "--max-tokens: must be >= 1, got -5"),
    (GEN + ["--token-ids", "1", "--temperature", "-1"], "--temperature"),
    (GEN + ["--token-ids", "1,a"], "--token-ids"),
    (GEN + ["--token-ids", "1", "--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
    *CUDA,
    (["generate", "--model", "{llama}", "--token-ids", "1"], "unsupported model_type 'llama'; supported: "),
    (["run", "--num-draft-tokens", "0"], "--num-draft-tokens: must be >= 1"),
    (["run", "--num-requests", "0"], "--num-requests: must be >= 1"),
    (["run", "--max-num-seqs", "0"], "--max-num-seqs: must be >= 1"),
    (["run", "--host-requests", "nan"], "--host-requests"),
    (["run", "--device", "tpu"], "--device"),
    (["run", "--model", "{empty}"], "has no config.json"),
    (GEN + ["--token-ids", "1", "--temperature", "inf"], "--temperature"),
    (GEN + ["--token-ids", "1", "--temperature", "0.001"], "temperature must be 0 or >= 0.01"),
    (GEN + ["--token-ids", "1", "--top-p", "0"], "--top-p"),
    (GEN + ["--token-ids", "1", "--top-p", "1.5"], "--top-p"),
    (GEN + ["--token-ids", "1", "--top-k", "-1"], "--top-k"),
    (GEN + ["--token-ids", "1", "--seed", "-1"], "--seed"),
    (GEN + ["--token-ids", "1", "--seed", "1.5"], "--seed"),
    (GEN + ["--token-ids", "1", "--max-tokens", "2.5"], "--max-tokens"),
    (GEN + ["--token-ids", "1,,2"], "--token-ids"),
    (GEN + ["--token-ids", "-1"], "--token-ids"),
    (GEN + ["--token-ids", "1,96"], "--token-ids: 96 is outside the vocabulary [0, 96)"),
    (GEN + ["--token-ids", "1", "--num-draft-tokens", "-1"], "--num-draft-tokens"),
    (GEN + ["--token-ids", "1", "--max-num-seqs", "0"], "--max-num-seqs"),
    (GEN + ["--token-ids", "1", "--max-model-len", "0"], "--max-model-len"),
    (GEN + ["--token-ids", "1", "--page-size", "0"], "--page-size"),
    (GEN + ["--token-ids", "1", "--device-cache-bytes", "lots"], "--device-cache-bytes"),
    (GEN + ["--token-ids", "1", "--host-cache-bytes", "0"], "--host-cache-bytes"),
    (GEN + ["--token-ids", "1", "--device", "cuda:x"], "--device"),
    (GEN, "give --prompt TEXT or --token-ids"),
    (GEN + ["--token-ids", "1", "--prompt", "hi"], "not both"),
    (GEN + ["--unknown"], "unrecognized arguments: --unknown"),
    (["serve-nothing"], "invalid choice"),
    ([], "required"),
]


@pytest.mark.parametrize("argv, message", MISTAKES, ids=[" ".join(a[2:] if a[:1] == ["generate"] else a)
                                                          for a, _ in MISTAKES])
def test_mistake_is_one_line_and_exit_2_before_the_model_loads(argv, message, tiny, llama, tmp_path, capsys, no_load):
    argv = [a.format(tiny=tiny, llama=llama, empty=tmp_path) for a in argv]
    err = _one_line_error(capsys, argv)
    assert message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "hi"], "has no tokenizer"),                                     # needs the loaded tokenizer
    (["--token-ids", "1", "--device-cache-bytes", "1K"], "the budget is 1024"),  # BudgetTooSmallError
    (["--token-ids", "1", "--max-model-len", "3", "--max-tokens", "5"], "exceeds max_model_len 3"),
], ids=["text-without-tokenizer", "budget-too-small", "too-long"])
def test_library_errors_after_loading_are_one_line(argv, message, tiny, capsys):
    err = _one_line_error(capsys, ["generate", "--model", str(tiny), *argv])
    assert err.startswith("hybridcache: error: ") and message in err, err


def test_corrupt_checkpoint_is_one_line(tiny, tmp_path, capsys):
    for f in tiny.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:1000])
    err = _one_line_error(capsys, ["generate", "--model", str(tmp_path), "--token-ids", "1"])
    assert str(file) in err


def test_generate_takes_the_cache_options(tiny, capsys):
    argv = ["generate", "--model", str(tiny), "--token-ids", "5,6,7", "--token-ids", "1,2", "--max-tokens", "4",
            "--ignore-eos", "--num-draft-tokens", "2", "--max-num-seqs", "2", "--device-cache-bytes", "1M",
            "--host-cache-bytes", "512K", "--page-size", "8", "--enforce-eager", "--max-model-len", "64",
            "--max-num-batched-tokens", "32", "--dtype", "float32"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line.split()) == 4 for line in lines)


def test_generate_uses_one_thread_for_a_tiny_model_on_cpu(tiny, capsys, monkeypatch):
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    assert main(["generate", "--model", str(tiny), "--token-ids", "1,2", "--max-tokens", "1"]) == 0
    assert threads == [1]


def test_help_shows_defaults_and_choices(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "{auto,float32,bfloat16,float16}" in text
    assert "(default: 32)" in text and "(default: float32)" in text and "(default: 16)" in text
    for option in ("--device-cache-bytes", "--host-cache-bytes", "--page-size", "--max-num-seqs",
                   "--num-draft-tokens", "--enforce-eager"):
        assert option in text


def test_dtype_choices_cover_the_engine():
    from hybridcache.engine.llm import DTYPES

    assert set(DTYPES) <= set(cli.DTYPE_CHOICES)


@pytest.mark.parametrize("text, value", [("1048576", 1 << 20), ("64M", 64 << 20), ("2g", 2 << 30),
                                         ("512KiB", 512 << 10), ("3MB", 3 << 20)])
def test_byte_counts(text, value):
    assert cli.byte_count(text) == value
