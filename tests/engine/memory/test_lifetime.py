"""Lifetime analysis and packing: conflicting tensors never share bytes."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.engine.memory.lifetime import Step, analyze
from flowrt.engine.memory.lifetime_managers import BlobLifetimeManager, OffsetLifetimeManager


def _chain():
    # t0 -> s0 -> t1 -> s1 -> t2 -> s2 -> t3 (output)
    steps = [Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,))]
    return analyze(steps, {1: 100, 2: 100, 3: 100}, pinned={3}, aliases={})


def test_a_chain_reuses_bytes_of_dead_tensors():
    lifetimes = _chain()
    t1, t2, t3 = lifetimes.tensors
    assert lifetimes.may_share(t1, t3)
    assert not lifetimes.may_share(t1, t2)
    plan = OffsetLifetimeManager(alignment=1).plan(lifetimes)
    assert plan.arena_bytes == 200
    assert plan.placements[1].offset == plan.placements[3].offset


def test_pinned_outputs_are_never_reused():
    steps = [Step((0,), (1,)), Step((1,), (2,)), Step((0,), (3,))]
    lifetimes = analyze(steps, {1: 10, 2: 10, 3: 10}, pinned={1}, aliases={})
    t1, _, t3 = lifetimes.tensors
    assert not lifetimes.may_share(t1, t3)


def test_concurrent_branches_never_share_even_when_serial_order_would_allow():
    # x -> a1 -> a2 (branch A), x -> b1 -> b2 (branch B), join reads a2 and b2
    steps = [Step((0,), (1,)), Step((1,), (2,)), Step((0,), (3,)), Step((3,), (4,)), Step((2, 4), (5,))]
    lifetimes = analyze(steps, {t: 64 for t in range(1, 6)}, pinned={5}, aliases={})
    a1 = next(t for t in lifetimes.tensors if t.tensor == 1)
    b1 = next(t for t in lifetimes.tensors if t.tensor == 3)
    # a1 is dead (step 1) before b1 is born (step 2) in the serial order, but branch B may
    # run at the same time as branch A.
    assert a1.last < b1.first
    assert not lifetimes.may_share(a1, b1)
    assert lifetimes.lower_bound_bytes() >= 4 * 64


def test_a_view_extends_the_lifetime_of_what_it_aliases():
    # s0 writes t1; s1 is a view t2 of t1; s2 reads t2 and writes t3; s3 writes t4 from t3
    steps = [Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((3,), (4,))]
    lifetimes = analyze(steps, {1: 50, 3: 50, 4: 50}, pinned={4}, aliases={2: 1})
    t1, t3, t4 = lifetimes.tensors
    assert t1.last == 2  # read through the view by step 2
    assert not lifetimes.may_share(t1, t3)
    assert lifetimes.may_share(t1, t4)


@st.composite
def _dags(draw):
    n = draw(st.integers(2, 14))
    steps, sizes = [], {}
    for i in range(n):
        k = draw(st.integers(0, min(i, 3)))
        reads = tuple(sorted(set(draw(st.lists(st.integers(0, i), min_size=k, max_size=k))))) or (0,)
        reads = tuple(r for r in reads if r <= i)  # tensor r is written by step r-1 (0 is the feed)
        steps.append(Step(reads, (i + 1,)))
        sizes[i + 1] = draw(st.integers(1, 300))
    pinned = {n}
    return steps, sizes, pinned


@settings(max_examples=150, deadline=None)
@given(_dags())
def test_packings_keep_conflicting_tensors_apart(dag):
    steps, sizes, pinned = dag
    lifetimes = analyze(steps, sizes, pinned, aliases={})
    for manager in (OffsetLifetimeManager(alignment=8), BlobLifetimeManager(alignment=8)):
        plan = manager.plan(lifetimes)
        assert plan.arena_bytes >= lifetimes.lower_bound_bytes()
        assert plan.arena_bytes <= sum(-(-s // 8) * 8 for s in sizes.values())
        for a, b in itertools.combinations(lifetimes.tensors, 2):
            if lifetimes.may_share(a, b):
                continue
            pa, pb = plan.placements[a.tensor], plan.placements[b.tensor]
            assert pa.offset + pa.nbytes <= pb.offset or pb.offset + pb.nbytes <= pa.offset
            assert pa.offset + pa.nbytes <= plan.arena_bytes
