"""``make-tiny-model DIR``: write a tiny Llama-style model that vLLM loads, generated locally.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with ``tokenizers`` on a small
corpus built into this module; the model is a 2-layer Llama with random weights, written with
``transformers``' ``save_pretrained`` in the Hugging Face layout (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` with a chat template).

The output head is shaped so the model only chooses printable text: the rows of ``lm_head`` for
the special tokens (``<s>``, ``</s>``, ``<unk>``, ``<pad>``) and for byte tokens that are not
printable ASCII on their own are zero, while the others are scaled so they score far above
zero. A request therefore ends at ``max_tokens`` (or a stop string), which is what tests and
benchmarks need: output length is theirs to choose, not the dice's; and the text is readable.

The same seed writes the same model. Generation takes a few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")

CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<s>system: You may call these tools: <tools>' }}"
    "{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
    '{{ \'</tools> Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>\\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + ': ' + (message['content'] or '') }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '<tool_call>' }}"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "{{ '</tool_call>' }}"
    "{% endfor %}"
    "{% if message.tool_call_id %}{{ ' (' + message.tool_call_id + ')' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}"
)
"""Plain ``role: content`` lines; with ``tools``, a Hermes-style system line first that lists
them and shows the ``<tool_call>`` form vLLM's ``hermes`` tool parser reads (the model is random:
only a constrained request is sure to produce one). An assistant's earlier ``tool_calls`` are
written in that form (their ``arguments`` as the object a template is handed), a tool's answer
with its ``tool_call_id``: a second turn's prompt shows both."""

# Plain prose about the project's own subject, so the vocabulary covers ordinary English words.
_CORPUS = """
A client sends a request to a model server and waits for tokens. Sometimes the client leaves:
a browser tab is closed, a timeout fires, a deadline passes, a user presses stop. The server
should notice and stop generating, because every token it makes for nobody costs time on the
accelerator, memory in the key value cache and a slot in the batch that another request needs.
The proxy watches each connection. When the connection closes, it calls the cancel endpoint of
the gateway with the request id. The gateway finds the engine that owns the request and asks it
to abort. The engine frees the cache blocks at the next step and the waiting queue moves on.
Requests move through phases: queued while they wait for a slot, prefill while the prompt is
read, and decode while new tokens are produced one step at a time. A long prompt spends many
steps in prefill when the scheduler splits it into chunks. Metrics count the tokens generated,
the tokens wasted on clients that hung up, and the time from the cancel call to the abort.
The quick brown fox jumps over the lazy dog. Numbers one two three four five six seven eight
nine ten eleven twelve. Monday Tuesday Wednesday Thursday Friday Saturday Sunday. January
February March April May June July August September October November December. Red green
blue yellow orange purple black white. North south east west. Hello world, how are you today?
I am fine, thank you. What is the weather like? It is sunny and warm, with a light breeze.
"""


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    logit_scale: float = 1.0
    """Standard deviation of the ordinary ``lm_head`` rows; with unit-RMS hidden states the
    ordinary logits spread by about ``sqrt(hidden_size) * logit_scale``."""
    seed: int = 0


def train_tokenizer(spec: TinyModelSpec) -> object:
    """A byte-level BPE tokenizer trained on the built-in corpus (any text round-trips)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([line for line in _CORPUS.splitlines() if line], trainer)
    return tokenizer


def _printable(tokenizer: Any, token_id: int) -> bool:
    text = tokenizer.decode([token_id])
    return bool(text) and all(c == "\n" or " " <= c <= "~" for c in text)


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tiny_model(directory: Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the model into ``directory`` (created if missing) and return it."""
    # Through importlib: typed as Any, so the type checker does not walk torch and transformers.
    torch: Any = import_module("torch")
    transformers: Any = import_module("transformers")

    spec = spec or TinyModelSpec()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    tokenizer.save(str(directory / "tokenizer.json"))  # type: ignore[attr-defined]
    (directory / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2))
    special_ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]  # type: ignore[attr-defined]
    vocab_size = tokenizer.get_vocab_size()  # type: ignore[attr-defined]
    silent = [i for i in range(vocab_size) if i in special_ids or not _printable(tokenizer, i)]

    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=special_ids[1],
        eos_token_id=special_ids[2],
        pad_token_id=special_ids[3],
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        head = model.lm_head.weight
        head.normal_(0.0, spec.logit_scale)
        head[silent] = 0.0
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="hangup-gateway make-tiny-model",
        description="Write a tiny Llama-style model (random weights, locally trained tokenizer).",
    )
    defaults = TinyModelSpec()
    parser.add_argument("directory", type=Path, help="where to write it (created if missing)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    parser.add_argument(
        "--max-position-embeddings", type=int, default=defaults.max_position_embeddings
    )
    args = parser.parse_args(argv)
    spec = TinyModelSpec(
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
    )
    try:
        path = write_tiny_model(args.directory, spec)
    except ImportError as exc:
        print(f"make-tiny-model needs torch, transformers and tokenizers: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a tiny Llama model to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
