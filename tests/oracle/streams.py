"""Random skewed id streams and a replay of plans against simulated trainer caches (test helpers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bagpipe.oracle import OracleConfig, RoundPlan, StepPlan


def skewed_stream(
    seed: int, num_steps: int, batch_size: int = 6, table_sizes: Sequence[int] = (40, 15, 60)
) -> list[np.ndarray]:
    """``num_steps`` ``[B, F]`` global-id matrices, Zipf-skewed per table (hot rows repeat)."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum((0, *table_sizes[:-1]))
    columns = [
        offsets[f] + (rng.zipf(1.3, size=(num_steps, batch_size)) - 1) % size
        for f, size in enumerate(table_sizes)
    ]
    return [np.stack([c[i] for c in columns], axis=1).astype(np.int64) for i in range(num_steps)]


def min_capacity(stream: Sequence[np.ndarray], config: OracleConfig) -> int:
    """The largest number of rows any round needs at once (steps ``(r-1)*ci - 1 .. last``)."""
    ci, num_steps = config.ci, len(stream)
    needed = 0
    for r in range(-(-num_steps // ci)):
        start, stop = max(0, (r - 1) * ci - 1), min((r + 1) * ci, num_steps)
        needed = max(
            needed, np.unique(np.concatenate([m.ravel() for m in stream[start:stop]])).size
        )
    return needed


def belady_fetches(stream: Sequence[np.ndarray], capacity: int) -> int:
    """Rows fetched by Belady's offline policy: per step, fetch missing rows, evict furthest next use."""
    uses: dict[int, list[int]] = {}
    for i, m in enumerate(stream):
        for x in np.unique(m).tolist():
            uses.setdefault(x, []).append(i)
    cursor = dict.fromkeys(uses, 0)
    cache: set[int] = set()
    fetches = 0
    for m in stream:
        now = set(np.unique(m).tolist())
        for x in now:
            cursor[x] += 1
        missing = now - cache
        fetches += len(missing)
        cache |= missing
        if len(cache) > capacity:

            def next_use(x: int) -> int:
                c = cursor[x]
                return uses[x][c] if c < len(uses[x]) else 1 << 40

            victims = sorted(cache - now, key=next_use, reverse=True)[: len(cache) - capacity]
            cache -= set(victims)
    return fetches


def replay(
    stream: Sequence[np.ndarray], config: OracleConfig, plans: Sequence[StepPlan | RoundPlan]
) -> None:
    """Run the plans on simulated trainer caches and assert every guarantee of ``plan.py``.

    Tracks, per trainer, which rows it holds and whether its copy is fresh (has every update), and
    whether the servers' copy is fresh. Round ``r``'s plan runs (evict, write back, barrier,
    prefetch) before step ``r*ci``; a step updates the rows it uses on the trainers that sync them.
    """
    num_trainers, lookahead = config.num_trainers, config.lookahead
    held: list[dict[int, bool]] = [{} for _ in range(num_trainers)]  # row -> fresh
    server_fresh: dict[int, bool] = {}
    last_use: dict[int, int] = {}
    uses: dict[int, list[int]] = {}
    unique = [np.unique(m) for m in stream]
    for i, u in enumerate(unique):
        for x in u.tolist():
            uses.setdefault(x, []).append(i)
    per_trainer = stream[0].shape[0] // num_trainers
    next_step = 0
    evicted_total = lease_breaks = 0
    for plan in plans:
        if isinstance(plan, RoundPlan):
            evict = plan.evict.tolist()
            assert evict == sorted(set(evict)) and len(plan.writeback_owner) == len(evict)
            for x, owner in zip(evict, plan.writeback_owner.tolist(), strict=True):
                assert 0 <= owner < num_trainers
                assert held[owner].get(x) is True, (
                    f"round {plan.round_index}: {x} not fresh on {owner}"
                )
                if plan.first_step <= plan.last_step:
                    assert last_use[x] <= config.eviction_cutoff(plan.round_index)
                    later = [n for n in uses[x] if n > last_use[x]]
                    lease_breaks += bool(later) and later[0] <= last_use[x] + lookahead
                server_fresh[x] = True
                for cache in held:
                    cache.pop(x, None)
            evicted_total += len(evict)
            prefetch = plan.prefetch.tolist()
            assert prefetch == sorted(set(prefetch))
            for x, owner in zip(prefetch, plan.prefetch_owner.tolist(), strict=True):
                assert server_fresh.get(x, True), f"round {plan.round_index}: stale fetch of {x}"
                assert all(x not in cache for cache in held), f"{x} fetched while resident"
                for k in range(num_trainers) if owner == -1 else (owner,):
                    held[k][x] = True
            if config.capacity is not None:
                assert len(set().union(*held)) <= config.capacity
            continue
        i = plan.step
        assert i == next_step
        next_step += 1
        now, later, single = (
            plan.sync_now.tolist(),
            plan.sync_later.tolist(),
            plan.singleton.tolist(),
        )
        assert sorted(now + later + single) == unique[i].tolist()
        following = set(unique[i + 1].tolist()) if i + 1 < len(stream) else set()
        assert set(now) == set(unique[i].tolist()) & following
        for x in now + later:  # all-reduced: every trainer holds a fresh copy
            assert all(cache.get(x) is True for cache in held), (
                f"step {i}: {x} not fresh everywhere"
            )
            server_fresh[x] = False
            last_use[x] = i
        for x, owner in zip(single, plan.singleton_owner.tolist(), strict=True):
            examples = np.flatnonzero((stream[i] == x).any(axis=1))
            assert examples.tolist() == [examples[0]] and examples[0] // per_trainer == owner
            assert not any(i < n <= i + lookahead for n in uses[x])
            assert held[owner].get(x) is True, f"step {i}: singleton {x} not fresh on {owner}"
            for k, cache in enumerate(held):
                if k != owner and x in cache:
                    cache[x] = False  # the others' copies go stale
            server_fresh[x] = False
            last_use[x] = i
    assert next_step == len(stream)
    assert not any(held), "the flush plan leaves nothing resident"
    assert all(server_fresh.values()), "every updated row was written back"
    if config.capacity is None:
        assert lease_breaks == 0
