"""runtime/scheduler.py without a model: the typed plan of one engine step under a token budget."""

from __future__ import annotations

import pytest

from coverpruner.runtime.scheduler import Pending, PrefillChunk, Scheduler, StepPlan


def test_decodes_first_then_chunks_under_the_budget():
    plan = Scheduler(16, 4).plan([(0, 0), (1, 0)], [Pending(7, total=40), Pending(8, total=5)], free_slots=2)
    assert plan.decodes == ((0, 0), (1, 0))
    assert plan.prefills == (PrefillChunk(7, 0, 14, 40),)  # 16 - 2 decodes; request 8 waits for the next step
    assert plan.tokens == 16 and not plan.prefills[0].final


def test_a_long_prefill_runs_in_chunks_across_steps_to_its_last_row():
    sched, done, chunks = Scheduler(8, 2), 0, []
    while done < 30:
        (chunk,) = sched.plan([(0, 0)], [Pending(3, 30, done, started=done > 0)], free_slots=1 if done else 2).prefills
        chunks.append((chunk.start, chunk.stop))
        done = chunk.stop
    assert chunks == [(0, 7), (7, 14), (14, 21), (21, 28), (28, 30)]
    assert PrefillChunk(3, 28, 30, 30).final


def test_started_prefills_always_advance_and_come_first():
    """A request that holds its slot takes at least a row every step (a batched step feeds every slot), even with the
    budget spent on decodes; a new one starts only while budget and slots are left; a restored prefix is skipped."""
    pending = [Pending(5, 100, 0), Pending(4, 50, 20, started=True)]
    plan = Scheduler(4, 4).plan([(0, 0), (1, 0), (2, 0), (3, 0)], pending, free_slots=0)
    assert plan.prefills == (PrefillChunk(4, 20, 21, 50),) and plan.tokens == 5
    plan = Scheduler(32, 4).plan([], [Pending(5, 100, 48), Pending(6, 10)], free_slots=4)
    assert plan.prefills == (PrefillChunk(5, 48, 80, 100),)  # starts after its cached 48 rows; 6 waits
    # first come, first served: a request whose n slots are not free holds the ones behind it
    plan = Scheduler(64, 4).plan([(0, 0)], [Pending(5, 10, slots=4), Pending(6, 10)], free_slots=3)
    assert plan.prefills == ()


def test_no_budget_prefills_whole_and_the_budget_must_fit_a_batch():
    plan = Scheduler(None, 1).plan([], [Pending(1, 3000)], free_slots=1)
    assert plan.prefills == (PrefillChunk(1, 0, 3000, 3000),) and plan.budget is None
    assert StepPlan().empty and not plan.empty
    with pytest.raises(ValueError, match="max_step_tokens must be an integer >= the max batch"):
        Scheduler(4, 8)


def test_chunks_never_cut_a_whole_range():
    """Contract v5's blocks: a chunk ends before a range one call must hold (its last row runs alone in the decode
    call, so not at the range's last row either), or, when that leaves nothing, after it, over the budget."""
    whole = ((10, 30), (31, 35))
    sched, done, chunks = Scheduler(8, 2), 0, []
    while done < 40:
        (chunk,) = sched.plan([(0, 0)], [Pending(3, 40, done, started=done > 0, whole=whole)],
                              free_slots=1 if done else 2).prefills
        chunks.append((chunk.start, chunk.stop))
        done = chunk.stop
    assert chunks == [(0, 7), (7, 10), (10, 31), (31, 38), (38, 40)]
