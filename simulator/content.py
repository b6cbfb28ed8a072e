"""What a request's tokens are, as far as the prefix cache can tell: block keys.

vLLM hashes each full block of 16 tokens together with its parent block's hash,
so a block's hash stands for the whole prefix up to and including it. The
simulator abstracts token ids away and names a prefix by a *path label*: a
sequence is a list of segments ``(label, n_tokens)`` where each label implies
every segment before it (a session id implies the shared system prompt, a
document-set version implies the system prompt above it). Block ``i``'s key is
then ``(label of the segment holding the block's last token, i)``, which is
exactly as discriminating as a chained hash.

``filler`` is the one generator of made-up text (load generator prompts, the
live server's answers).

Text sent to the live server becomes content through ``TextContent``: the text
is cut into blocks of ``block_size * CHARS_PER_TOKEN`` characters and each full
block's key is a chained BLAKE2 digest, so the same leading text always gives
the same leading keys (prefix-stable), and tokens = ceil(chars / 4).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 151_936

# the vocabulary of every generated text (load generator prompts, the live server's answers)
WORDS = (
    "alpha",
    "build",
    "commit",
    "diff",
    "error",
    "fix",
    "grep",
    "hash",
    "index",
    "json",
    "kernel",
    "lint",
    "merge",
    "node",
    "output",
    "patch",
    "query",
    "repo",
    "stack",
    "test",
    "unit",
    "value",
    "write",
    "yaml",
)

Span = tuple[Hashable, int, int]  # (label, first block, end block), keys (label, i) for i in [first, end)


def tokens_of_text(text: str) -> int:
    """Token count of ``text``: one token per 4 characters, rounded up (documented ratio)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def filler(rng: random.Random, tokens: int) -> str:
    """Exactly ``tokens`` simulator tokens of text (4 characters each): words drawn by ``rng``.

    The one filler-text generator of the simulator (prompts of the load generator, answers of the live server).
    """
    width = max(0, tokens) * CHARS_PER_TOKEN
    parts: list[str] = []
    size = 0
    while size < width:
        w = rng.choice(WORDS) + " "
        parts.append(w)
        size += len(w)
    return "".join(parts)[:width]


def words(rng: random.Random, n: int) -> str:
    """``n`` space-separated words of `WORDS`, drawn by ``rng``: text for a *real* engine.

    The real engine's tiny tokenizer (``realengine``) is trained so that each of these words is one
    token, so ``n`` is the text's token count there (live runs, the cost-model fit, its tests).
    """
    return " ".join(rng.choice(WORDS) for _ in range(max(0, n)))


def tokenize(text: str) -> list[int]:
    """Deterministic, prefix-stable token ids: token j depends only on characters [4j, 4j+4)."""
    ids = []
    for j in range(0, len(text), CHARS_PER_TOKEN):
        digest = hashlib.blake2b(text[j : j + CHARS_PER_TOKEN].encode(), digest_size=4).digest()
        ids.append(int.from_bytes(digest, "little") % VOCAB_SIZE)
    return ids


class Content:
    """A token sequence described by block keys (see the module doc)."""

    def spans(self, first: int, end: int, block_size: int) -> Iterator[Span]:
        raise NotImplementedError


@dataclass
class SegmentContent(Content):
    """Segments ``(path_label, n_tokens)``; the last segment may grow (a session's stream)."""

    segments: Sequence[tuple[Hashable, int]]
    _bounds: list[tuple[Hashable, int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        start = 0
        for label, n in self.segments:
            self._bounds.append((label, start, start + n))
            start += n

    def spans(self, first: int, end: int, block_size: int) -> Iterator[Span]:
        if end <= first:
            return
        for label, s, e in self._bounds:
            lo = max(first, s // block_size)
            hi = min(end, e // block_size)
            if lo < hi:
                yield (label, lo, hi)
            if hi >= end:
                return


class TextContent(Content):
    """Content of a text (prompt + generated answer): chained digests of full character blocks."""

    def __init__(self, text: str, block_size: int) -> None:
        self.text = text
        self.block_size = block_size
        width = block_size * CHARS_PER_TOKEN
        self._keys: list[bytes] = []
        parent = b""
        for j in range(len(text) // width):
            parent = hashlib.blake2b(
                parent + text[j * width : (j + 1) * width].encode(), digest_size=16
            ).digest()
            self._keys.append(parent)

    def spans(self, first: int, end: int, block_size: int) -> Iterator[Span]:
        assert block_size == self.block_size
        for i in range(first, min(end, len(self._keys))):
            yield (self._keys[i], i, i + 1)
        for i in range(max(first, len(self._keys)), end):
            # beyond the known text (tokens generated but not yet rendered): unique keys
            yield ((id(self), "gen", i), i, i + 1)
