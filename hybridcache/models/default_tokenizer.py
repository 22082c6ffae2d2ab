"""The embedded default's tokenizer: byte-level BPE trained on a built-in text; same files every time.

Ids 0..2 are `<pad>`, `<s>`, `</s>` (the model config's pad, bos and eos ids), then the 256 byte
symbols, then merges up to the model's vocab size. Any text encodes (bytes are the fallback) and any id
below the vocab size decodes. Nothing is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2 in this order
PAD, BOS, EOS = SPECIAL_TOKENS

# One turn is `<s>{role}\n{content}</s>\n`; the model's eos (`</s>`) ends the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)

CORPUS = """\
Hello! How are you today? I am fine, thank you. What can I do for you?
The user asks a question and the assistant gives an answer. The system sets the rules of the chat.
A hybrid language model interleaves attention layers with recurrent layers. Attention keeps a cache of
keys and values that grows with the sequence; a recurrent layer keeps a state of fixed size for each
sequence. The engine serves many requests at once: it schedules them, runs the model one step at a
time, and streams the tokens back as they are generated.
When memory runs short, a request is suspended to host memory and resumed later in another slot, or its
state is dropped and computed again from its prompt. Speculative decoding drafts a few tokens and the
model verifies them in one step; the accepted tokens are kept and the rest are thrown away.
This is a small model for tests and examples. Its weights are random, so its words make no sense, but
every part of the engine runs on it: the cache, the scheduler, the sampler, the server and the client.
Please write a short story about a cat who lives in a library and reads books at night.
Once upon a time there was a little house by the river, and in the house there lived an old man with
his dog. Every morning they walked along the water, and every evening they sat by the fire.
Numbers and code: 0 1 2 3 4 5 6 7 8 9 10 100 1000, def main(argv): return 0, {"key": "value"}, [1, 2, 3].
Questions: who, what, when, where, why, how? Answers: yes, no, maybe, of course, I do not know.
"""


def build_default_tokenizer(vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` (byte-level BPE) with at most `vocab_size` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tokenizer.get_vocab_size() <= vocab_size
    return tokenizer


def save_default_tokenizer(path: str | Path, vocab_size: int, max_len: int) -> None:
    """Write tokenizer.json + tokenizer_config.json to `path`, loadable as a transformers
    `PreTrainedTokenizerFast` (`AutoTokenizer`), the chat template inside the config.

    Both files are written here rather than by `save_pretrained`, so their bytes do not depend on the
    transformers version.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_default_tokenizer(vocab_size).save(str(path / "tokenizer.json"), pretty=True)
    config = dict(tokenizer_class="PreTrainedTokenizerFast", pad_token=PAD, bos_token=BOS, eos_token=EOS,
                  model_max_length=max_len, add_bos_token=False, add_eos_token=False,
                  clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
