"""A turn's prompt in tokens before the engine answers, learned from what the engine reported.

The sidecar counts a turn's prompt in the KV demand while it is in flight (``core.budgeter``:
``max(context, prompt in flight) + output budget``), before the engine's usage says how many tokens
it was. It sees characters. A fixed characters-per-token ratio is wrong twice:

* the tokenizer: about 4 characters a token for English prose on BPE vocabularies, fewer for code,
  one or two for Chinese or Japanese text;
* the chat template: role markers and separators around every message are tokens no character of
  the request accounts for. On the collapse demo (a ChatML template, a tokenizer of exactly 4
  characters a token), characters / 4 counted the prompts in flight 1.26% short (0.5-1.6%,
  deciles, 1,481 turns of six runs): the forecast, starting from those counts, prefilled its
  sessions' contexts that much short for the rest of their lives and ran 1-2% fast
  (docs/dashboard.md, "Session 17").

``PromptEstimator`` corrects both from the engine's own counts, per sidecar (one engine, one
tokenizer; a model name a client sends is not trusted to key anything):

* ``observe(session, chars, exact, prompt_tokens)`` after a finished turn whose engine reported its
  prompt: ``chars`` are the request's text characters, ``exact`` its token-id parts (counted
  exactly, ``sidecar.openai_payload.prompt_size``), ``prompt_tokens`` the engine's count. The
  learned tokens per character are the ratio of sums over the last ``WINDOW_TURNS`` such turns with
  text, ``sum(prompt_tokens - exact) / sum(chars)`` (long prompts weigh as much as they weigh in
  demand); below ``MIN_TURNS`` of them, ``1 / chars_per_token`` (the configured prior).
* ``estimate(session, chars, exact)``: a session's next turn usually repeats its previous prompt
  and adds to it (the answer, the tool's output, the next question), and the engine counted the
  previous one exactly. So, when the session's last observed turn had at most as many characters
  and token ids as this one:

      estimate = last prompt_tokens + ceil((chars - last chars) * tokens per char) + (exact - last exact)

  and otherwise (a first turn, a rewritten or compacted history, no observation) the whole request
  at the ratio: ``ceil(chars * tokens per char) + exact``. Only the added text is estimated: on the
  demo, 650-800 tokens of a 6-38k-token prompt.
* ``forget(session)`` when the session ends; at most ``MAX_SESSIONS`` sessions are remembered (the
  least recently observed is dropped first), so no client can grow it without bound.

The ratio is the sidecar's, across its clients: one client's unusual text (long prompts a tokenizer
packs tightly, or a script it splits finely) moves it for every first turn within the window. A
continuing session's estimate leans on it only for the added text, and every finished turn replaces an
estimate with the engine's count.

It is not persisted: a restarted sidecar counts at the configured ratio until ``MIN_TURNS`` turns have
finished, and each session's next turn at the ratio. The sidecar's ``/state`` shows what it counts at
(``budgeter.chars_per_token``, ``budgeter.chars_per_token_source``: ``learned`` or ``configured``).

Pure: no clock, no I/O; the sidecar (``sidecar.control``) calls it. Tests:
``tests/core/test_prompt_estimate.py``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

WINDOW_TURNS = 500  # the turns the learned ratio is taken over, newest
MIN_TURNS = 20  # observations with text before the learned ratio replaces the configured one
MAX_SESSIONS = 100_000  # sessions whose last prompt is remembered


@dataclass(frozen=True)
class _Seen:
    chars: int
    exact: int
    tokens: int


class PromptEstimator:
    """Prompt tokens of a request from its characters (module doc)."""

    def __init__(
        self,
        chars_per_token: float,
        window: int = WINDOW_TURNS,
        min_turns: int = MIN_TURNS,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        if not (math.isfinite(chars_per_token) and chars_per_token > 0):
            raise ValueError(f"chars_per_token must be a finite number > 0, got {chars_per_token!r}")
        self.prior = 1.0 / chars_per_token
        self.min_turns = max(1, min_turns)  # a learned ratio rests on one turn at least
        self.max_sessions = max_sessions
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)  # (chars, text tokens)
        self._chars = 0
        self._tokens = 0
        self._sessions: OrderedDict[str, _Seen] = OrderedDict()

    @property
    def learned(self) -> bool:
        return len(self._recent) >= self.min_turns

    def tokens_per_char(self) -> float:
        """The learned ratio of sums, or the configured prior below ``min_turns`` observations."""
        return self._tokens / self._chars if self.learned else self.prior  # observed turns have chars > 0

    def chars_per_token(self) -> float:
        return 1.0 / self.tokens_per_char()

    def estimate(self, session: str | None, chars: int, exact: int = 0) -> int:
        """Tokens of a prompt of ``chars`` text characters and ``exact`` token ids (module doc)."""
        ratio = self.tokens_per_char()
        last = self._sessions.get(session) if session is not None else None
        if last is not None and chars >= last.chars and exact >= last.exact:
            return last.tokens + math.ceil((chars - last.chars) * ratio) + (exact - last.exact)
        return math.ceil(chars * ratio) + exact

    def observe(self, session: str | None, chars: int, exact: int, prompt_tokens: int) -> None:
        """The engine counted ``prompt_tokens`` for a request of ``chars`` characters and ``exact`` ids."""
        if prompt_tokens <= 0 or chars < 0 or exact < 0:
            return
        text_tokens = prompt_tokens - exact
        if chars > 0 and text_tokens > 0:
            if len(self._recent) == self._recent.maxlen:
                old_chars, old_tokens = self._recent[0]
                self._chars -= old_chars
                self._tokens -= old_tokens
            self._recent.append((chars, text_tokens))
            self._chars += chars
            self._tokens += text_tokens
        if session is not None:
            self._sessions.pop(session, None)
            self._sessions[session] = _Seen(chars, exact, prompt_tokens)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)

    def remembered(self) -> int:
        return len(self._sessions)
