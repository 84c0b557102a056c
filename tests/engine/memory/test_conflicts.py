"""The one-sweep conflict relation equals its definition: two tensors conflict when neither
is dead before the other, and plans keep conflicting tensors apart."""

from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.engine.memory.lifetime import Lifetimes, Step, analyze
from flowrt.engine.memory.lifetime_managers import OffsetLifetimeManager


@st.composite
def schedules(draw):
    """Random DAG schedules with views, sub-tensors (parts) and pinned outputs."""
    steps, tensors, sizes, pinned, aliases, parts = [], [0], {}, set(), {}, {}
    for _ in range(draw(st.integers(1, 30))):
        reads = tuple(draw(st.lists(st.sampled_from(tensors), max_size=3)))
        writes = tuple(range(len(tensors), len(tensors) + draw(st.integers(0, 2))))
        for t in writes:
            role = draw(st.sampled_from(["plain"] * 6 + ["view", "part", "pinned"]))
            owners = [x for x in tensors[1:] if x not in parts and x not in aliases]
            if role == "view" and reads:
                aliases[t] = reads[0]
            elif role == "part" and owners:
                parts[t] = draw(st.sampled_from(owners))
            else:
                sizes[t] = draw(st.sampled_from([1, 64, 100, 300]))
                if role == "pinned":
                    pinned.add(t)
        tensors += writes
        steps.append(Step(reads, writes))
    return steps, sizes, pinned, aliases, parts


@settings(max_examples=120, deadline=None)
@given(schedules())
def test_conflicts_found_in_one_sweep_are_exactly_the_pairs_where_neither_is_dead_first(case):
    lifetimes = analyze(*case)
    tensors = lifetimes.tensors
    # Without the schedule's edges (every ancestor taken as a parent) the answer is the same.
    closure = Lifetimes(tensors, lifetimes._ancestors, lifetimes.num_steps)
    for i, a in enumerate(tensors):
        expected = sum(
            1 << j
            for j, b in enumerate(tensors)
            if j != i and not (lifetimes.dead_before(a, b) or lifetimes.dead_before(b, a))
        )
        assert lifetimes.conflicts_with(a) == expected
        assert closure.conflicts_with(a) == expected
    plan = OffsetLifetimeManager().plan(lifetimes)
    assert plan.arena_bytes >= lifetimes.lower_bound_bytes()
