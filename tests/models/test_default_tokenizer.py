"""The embedded default's tokenizer: deterministic files, text round trip, ids within the model's vocab,
the chat template, and `LLM` on the default checkpoint taking text."""
import json
import subprocess
import sys

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.models import default_tokenizer, load_tokenizer
from hybridcache.models.default import DEFAULT_CONFIG, build_default_checkpoint

VOCAB = DEFAULT_CONFIG["vocab_size"]
TEXTS = ["hello", "Hello, world! How are you?", "  two  spaces\nand a newline\t", "héllo wörld — 你好 😀", ""]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    default_tokenizer.save_default_tokenizer(path, VOCAB, DEFAULT_CONFIG["max_position_embeddings"])
    return path


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_same_files_in_another_dir_and_another_process(tok_dir, tmp_path):
    default_tokenizer.save_default_tokenizer(tmp_path / "a", VOCAB, DEFAULT_CONFIG["max_position_embeddings"])
    # a fresh process (its own hash seeds), loading the module by path so only `tokenizers` is imported
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('t', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "m.save_default_tokenizer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))")
    subprocess.run([sys.executable, "-c", code, default_tokenizer.__file__, str(tmp_path / "b"), str(VOCAB),
                    str(DEFAULT_CONFIG["max_position_embeddings"])], check=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        first = (tok_dir / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() == first
        assert (tmp_path / "b" / name).read_bytes() == first


def test_vocab_fills_the_model_and_specials_match_the_config_ids(tok):
    assert len(tok) == VOCAB
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, DEFAULT_CONFIG["eos_token_id"])
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<s>", "</s>"]


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_with_ids_in_the_vocab(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < VOCAB for i in ids)
    assert tok.decode(ids) == text


def test_every_id_decodes(tok):
    assert isinstance(tok.decode(list(range(VOCAB))), str)


def test_merges_shorten_english(tok):
    text = "The user asks a question and the assistant gives an answer."
    assert len(tok.encode(text)) < len(text.encode()) / 2


def test_chat_template_renders_and_ends_turns_with_eos(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s>system\nBe brief.</s>\n<s>user\nhi</s>\n<s>assistant\n"
    ids = tok.encode(text)
    assert ids.count(1) == 3 and ids.count(2) == 2 and max(ids) < VOCAB
    assert not tok.apply_chat_template(messages[1:], tokenize=False).endswith("assistant\n")


def test_tokenizer_config_is_plain_json_with_the_template(tok_dir):
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == default_tokenizer.CHAT_TEMPLATE


def test_llm_on_the_default_checkpoint_takes_text_and_chat(tmp_path):
    path = build_default_checkpoint(tmp_path / "default")
    llm = LLM(path, max_num_seqs=2)
    assert llm.tokenizer is not None
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                               add_generation_prompt=True)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    text_out, chat_out = llm.generate(["hello", prompt], params)
    ids_out = llm.generate([llm.tokenizer.encode("hello")], params)[0]
    assert text_out.token_ids == ids_out.token_ids and len(text_out.token_ids) == 5
    assert isinstance(text_out.text, str) and isinstance(chat_out.text, str)
    assert all(0 <= t < VOCAB for t in text_out.token_ids + chat_out.token_ids)
