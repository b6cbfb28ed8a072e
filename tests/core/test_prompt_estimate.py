"""core.prompt_estimate: exact values."""

from __future__ import annotations

import pytest

from core.prompt_estimate import PromptEstimator


def test_before_min_turns_the_configured_ratio_counts_the_whole_request() -> None:
    est = PromptEstimator(4.0, min_turns=3)
    assert est.estimate(None, 1001) == 251  # ceil(1001 / 4)
    assert est.estimate(None, 1000, exact=7) == 257
    for _ in range(2):
        est.observe(None, 1000, 0, 300)
    assert not est.learned
    assert est.chars_per_token() == 4.0
    assert est.estimate(None, 1000) == 250


def test_the_learned_ratio_is_the_ratio_of_sums_over_the_window() -> None:
    est = PromptEstimator(4.0, window=3, min_turns=3)
    est.observe(None, 1000, 0, 300)
    est.observe(None, 3000, 0, 750)
    est.observe(None, 0, 0, 10)  # no text: teaches no ratio
    est.observe(None, 2000, 0, 550)
    assert est.learned
    assert est.tokens_per_char() == pytest.approx(1600 / 6000)
    est.observe(None, 1000, 0, 200)  # the first observation leaves the window
    assert est.tokens_per_char() == pytest.approx(1500 / 6000)
    assert est.chars_per_token() == pytest.approx(4.0)
    assert est.estimate(None, 4001) == 1001


def test_token_ids_are_counted_exactly_and_left_out_of_the_ratio() -> None:
    est = PromptEstimator(4.0, min_turns=1)
    est.observe(None, 300, 20, 120)  # 100 text tokens for 300 characters
    assert est.tokens_per_char() == pytest.approx(1 / 3)
    assert est.estimate(None, 600, exact=5) == 205


def test_a_session_s_next_prompt_is_its_last_count_plus_the_added_text() -> None:
    # a chat template adds tokens no character accounts for: the engine counted 1,260 where
    # characters / 4 says 1,000; the next turn adds 400 characters
    est = PromptEstimator(4.0)
    est.observe("s1", 4000, 0, 1260)
    assert est.estimate("s1", 4400) == 1260 + 100
    assert est.estimate("s2", 4400) == 1100  # another session: the ratio only
    # a shorter request (a compacted history) is counted whole
    assert est.estimate("s1", 2000) == 500
    # token ids added to the prompt are added exactly; fewer of them: counted whole
    est.observe("s3", 400, 10, 120)
    assert est.estimate("s3", 800, exact=12) == 120 + 100 + 2
    assert est.estimate("s3", 800, exact=4) == 204


def test_forget_and_the_bound_on_remembered_sessions() -> None:
    est = PromptEstimator(4.0, max_sessions=2)
    est.observe("a", 400, 0, 150)
    est.observe("b", 400, 0, 150)
    est.observe("a", 800, 0, 260)  # observed again: now the most recent
    est.observe("c", 400, 0, 150)  # drops b, the least recently observed
    assert est.remembered() == 2
    assert est.estimate("b", 800) == 200
    assert est.estimate("a", 1200) == 360
    est.forget("a")
    est.forget("never-seen")
    assert est.estimate("a", 1200) == 300
    assert est.remembered() == 1


def test_nonsense_is_ignored_and_a_bad_prior_refused() -> None:
    est = PromptEstimator(4.0, min_turns=1)
    est.observe("s", 100, 0, 0)
    est.observe("s", -5, 0, 10)
    assert not est.learned and est.remembered() == 0
    with pytest.raises(ValueError, match="chars_per_token"):
        PromptEstimator(0.0)
