"""The command line: `generate` with token ids and with text (a checkpoint with a tokenizer), `--help`."""
import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.cli import main
from tests.models.helpers import save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 96)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(path)
    return path


def test_generate_token_ids_equals_the_library(tiny, capsys):
    assert main(["generate", "--model", str(tiny), "--token-ids", "5,6,7,5,6", "--max-tokens", "6",
                 "--ignore-eos", "--num-draft-tokens", "2"]) == 0
    printed = capsys.readouterr().out.strip()
    text = LLM(tiny).generate(["w5 w6 w7 w5 w6"], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert printed == text.text
    assert printed.split() == [f"w{t}" for t in text.token_ids]


def test_generate_text_prompt(tiny, capsys):
    assert main(["generate", "--model", str(tiny), "--prompt", "w1 w2 w3", "--max-tokens", "4", "--ignore-eos"]) == 0
    words = capsys.readouterr().out.split()
    ids = LLM(tiny).generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    assert words == [f"w{t}" if t else "<unk>" for t in ids]


def test_help_for_every_command(capsys):
    for argv in (["--help"], ["run", "--help"], ["generate", "--help"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 0
    assert "--num-draft-tokens" in capsys.readouterr().out


def test_run_main_job_forces_suspensions_and_matches_the_unconstrained_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDCACHE_HOME", str(tmp_path))
    assert main(["run", "--quiet", "--num-requests", "10", "--max-tokens", "24"]) == 0
    out = capsys.readouterr().out
    stats = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith("equal"))
    assert int(stats["suspensions"]) > 0 and int(stats["resumes"]) > 0
    assert "equal to the unconstrained run without speculation: 10/10 yes" in out
    assert (tmp_path / "default-nemotron-h" / "config.json").exists()
