"""One completion request inside the simulated engine, and its states."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.content import Content

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


class RequestTooLong(ValueError):
    """A request needs more KV blocks than the whole pool; it could never be scheduled."""


@dataclass(eq=False)
class Request:
    """One completion request inside the engine."""

    id: str
    content: Content
    prompt_tokens: int
    max_tokens: int
    arrival: float
    session: str | None = None
    tag: object = None  # caller's data (the offline driver's turn, the server's waiter)
    num_computed: int = 0
    output: int = 0
    status: str = WAITING
    table: object = None
    cached_tokens: int | None = None
    first_scheduled: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    computed_prefill: int = 0
    finish_reason: str = "length"  # what the client is told when max_tokens is reached
    truth: object = None  # with a watch: why its missing prompt tokens were missing (simulator.truth)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
