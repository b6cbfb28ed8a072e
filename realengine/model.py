"""Build the tiny model directory the real vLLM engine serves: nothing is downloaded, ever.

Run with the engine environment's Python (it needs transformers, tokenizers and
torch, which PrefixOps' own environment does not have)::

    ENGINE_PYTHON realengine/model.py --out DIR [--layers 4 --hidden 256 ...]

What it writes into ``DIR``:

* a tokenizer trained here with the ``tokenizers`` library (byte-level BPE) on
  local text: this repository's Markdown and Python files plus the word list
  the live runs use for filler, so every filler word is one token (the live
  runs size prompts in those words);
* a chat template (system / user / assistant turns between special tokens);
* a Llama-architecture decoder with random weights (seeded), made with
  transformers, saved as safetensors in float32;
* ``prefixops-model.json``: the spec it was built from (the engine
  environment's cache is keyed on it).

The weights are random, so the answers are noise; what matters to PrefixOps is
the engine around the model: its scheduler, block pool, prefix cache, metrics
and usage reports, which are vLLM's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The live runs (simulator/live_run.py) build prompts from these words; one list: simulator.content.WORDS.
HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SPECIAL_TOKENS = [
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
]


def local_corpus(words: list[str]) -> list[str]:
    """Local text to train on: the repo's docs and code, plus filler in the live runs' words."""
    texts: list[str] = []
    for pattern in ("*.md", "**/*.md", "**/*.py"):
        for path in sorted(REPO.glob(pattern)):
            if ".venv" in path.parts or "data" in path.parts:
                continue
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                continue
    # many repetitions so each " word" becomes a single merged token
    line = " " + " ".join(words)
    texts.extend([line] * 400)
    return texts


def build_tokenizer(out: Path, vocab_size: int, words: list[str]) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(local_corpus(words), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>", unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1 << 20
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, spec: dict[str, int], tokenizer: object) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    vocab = len(tokenizer)  # type: ignore[arg-type]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["hidden"] // spec["heads"],
        max_position_embeddings=spec["max_positions"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",  # type: ignore[attr-defined]
    )
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    gen = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "do_sample": True,
        "temperature": 1.0,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--spec", required=True, help="JSON model spec (realengine.env.ModelSpec)")
    p.add_argument("--words", required=True, help="space-separated filler words that must be single tokens")
    args = p.parse_args(argv)
    spec = json.loads(args.spec)
    words = args.words.split()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, spec["vocab"], words)
    encode = tokenizer.encode  # type: ignore[attr-defined]
    multi = [w for w in words if len(encode(" " + w)) != 1]
    if multi:
        print(f"error: filler words not single tokens after training: {multi}", file=sys.stderr)
        return 1
    build_model(out, spec, tokenizer)
    (out / "prefixops-model.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    print(f"model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
