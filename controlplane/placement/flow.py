"""Class-level min-cost flow that tells the greedy fill which pools each shape should use.

Deployments with the same shape (replica size, admissible pools, cost row) form a class.
In GPU units the problem over classes is a transportation problem; we solve it with
  1. a greedy start (scarcest classes first, cheapest pools first, spot within budget),
  2. negative-cycle cancelling on the compressed graph whose nodes are the classes plus
     Z = "free capacity" (arc c -> c' = c takes a pool slot of c', who must go elsewhere),
  3. successive shortest paths from classes with unplaced GPUs to Z (chains of any depth:
     a restricted class takes the slot of a flexible one, which moves to a free pool).
The result, floor(flow / replica size) per (class, pool), becomes replica quotas that the
deployment-level fill consumes first. Flows stay integral in GPUs; never exceeds capacity.
Above MAX_CLASSES classes the engine runs the min-cost flow (network.py) instead of the
class LP: 100, not 300, since the flow carries the divisibility cuts (300 shapes: ~1 CPU s
instead of ~6, 2235 GPUs unplaced at 92 % against an optimum of 2227).
"""

from __future__ import annotations

import numpy as np

INF = np.inf
MAX_CLASSES = 100  # the exact class LP up to here (60 shapes: 57 classes, 0.6 s)
MAX_ROUNDS = 400


class ClassFlow:
    def __init__(
        self,
        cost: np.ndarray,
        supply: np.ndarray,
        free: np.ndarray,
        is_spot: np.ndarray,
        spot_cap: np.ndarray,
        rank: np.ndarray,
        sizes: np.ndarray,
    ) -> None:
        self.sizes = sizes.astype(np.int64)
        self.k = cost  # C x P $/GPU-hour, inf where not admissible
        self.unplaced = supply.astype(np.int64).copy()
        self.free = free.astype(np.int64).copy()
        self.f = np.zeros(cost.shape, dtype=np.int64)
        self.is_spot = is_spot
        self.spot_left = spot_cap.astype(np.int64).copy()
        self.rank = rank  # classes with lower rank are served first

    def solve(self) -> None:
        self._greedy()
        rounds = 0
        while rounds < MAX_ROUNDS and self._cancel_cycle():
            rounds += 1
        while rounds < MAX_ROUNDS and self._augment():
            rounds += 1

    def _greedy(self) -> None:
        for c in np.argsort(self.rank, kind="stable"):
            self._greedy_class(int(c))

    def _greedy_class(self, c: int) -> None:
        row = self.k[c]
        s = int(self.sizes[c])
        room = np.where(np.isfinite(row), self.free // s * s, 0)
        spot = self.is_spot & (room > 0)
        if spot.any():  # the spot budget goes to the cheapest spot pools
            idx = np.flatnonzero(spot)
            idx = idx[np.argsort(row[idx], kind="stable")]
            before = np.cumsum(room[idx]) - room[idx]
            room[idx] = np.clip(self.spot_left[c] - before, 0, room[idx]) // s * s
        idx = np.flatnonzero(room > 0)
        idx = idx[np.argsort(row[idx], kind="stable")]
        before = np.cumsum(room[idx]) - room[idx]
        take = np.clip(self.unplaced[c] - before, 0, room[idx]) // s * s
        self.f[c, idx] += take
        self.free[idx] -= take
        self.unplaced[c] -= int(take.sum())
        self.spot_left[c] -= int(take[self.is_spot[idx]].sum())

    def _arcs(self) -> tuple[np.ndarray, np.ndarray]:
        """Dense (C+1)^2 arc costs and the pool each arc goes through (Z is index C)."""
        n = len(self.unplaced)
        w = np.full((n + 1, n + 1), INF)
        via = np.full((n + 1, n + 1), -1, dtype=np.int64)
        enter = np.where((self.spot_left > 0)[:, None] | ~self.is_spot[None, :], self.k, INF)
        for c2 in range(n):
            pools = np.flatnonzero(self.f[c2] > 0)
            if len(pools) == 0:
                continue
            delta = enter[:, pools] - self.k[c2, pools][None, :]
            j = np.argmin(delta, axis=1)
            w[:n, c2] = delta[np.arange(n), j]
            via[:n, c2] = pools[j]
            jz = int(np.argmax(self.k[c2, pools]))
            w[n, c2] = -self.k[c2, pools[jz]]
            via[n, c2] = pools[jz]
        np.fill_diagonal(w, INF)
        free = np.flatnonzero(self.free > 0)
        if len(free):
            j = np.argmin(enter[:, free], axis=1)
            w[:n, n] = enter[np.arange(n), free[j]]
            via[:n, n] = free[j]
        return w, via

    def _capacity(self, a: int, b: int, p: int) -> int:
        n = len(self.unplaced)
        cap = int(self.free[p]) if b == n else int(self.f[b, p])
        if a < n and self.is_spot[p]:
            cap = min(cap, int(self.spot_left[a]))
        return cap

    def _apply(self, path: list[tuple[int, int, int]], amount: int) -> None:
        n = len(self.unplaced)
        for a, b, p in path:
            if b == n:
                self.free[p] -= amount
            else:
                self.f[b, p] -= amount
                if self.is_spot[p]:
                    self.spot_left[b] += amount
            if a == n:
                self.free[p] += amount
            else:
                self.f[a, p] += amount
                if self.is_spot[p]:
                    self.spot_left[a] -= amount

    def _cancel_cycle(self) -> bool:
        """Find one negative cycle (Bellman-Ford from a virtual source) and push around it."""
        w, via = self._arcs()
        n = len(w)
        dist = np.zeros(n)
        pred = np.full(n, -1, dtype=np.int64)
        changed = np.zeros(0, dtype=np.int64)
        for _ in range(n):
            alt = dist[:, None] + w
            u = np.argmin(alt, axis=0)
            best = alt[u, np.arange(n)]
            better = best < dist - 1e-9
            changed = np.flatnonzero(better)
            if len(changed) == 0:
                return False
            dist = np.where(better, best, dist)
            pred = np.where(better, u, pred)
        v = int(changed[0])
        for _ in range(n):
            v = int(pred[v])
        cycle, node = [], v
        for _ in range(n + 1):
            u = int(pred[node])
            cycle.append((u, node, int(via[u, node])))
            node = u
            if node == v:
                break
        if node != v:
            return False
        cycle.reverse()
        return self._push(cycle)

    def _push(self, path: list[tuple[int, int, int]]) -> bool:
        if any(p < 0 for _, _, p in path):
            return False
        amount = min(self._capacity(a, b, p) for a, b, p in path)
        step = max(int(self.sizes[x]) for a, b, _ in path for x in (a, b) if x < len(self.sizes))
        amount = amount // step * step or amount
        if amount <= 0:
            return False
        self._apply(path, amount)
        return True

    def _augment(self) -> bool:
        """Shortest path from the first class with unplaced GPUs to free capacity."""
        w, via = self._arcs()
        n = len(w) - 1
        dist = w[:, n].copy()
        dist[n] = 0.0
        succ = np.full(n + 1, n)
        for _ in range(n):
            alt = w[:n, :] + dist[None, :]
            j = np.argmin(alt, axis=1)
            best = alt[np.arange(n), j]
            better = best < dist[:n] - 1e-9
            if not better.any():
                break
            dist[:n] = np.where(better, best, dist[:n])
            succ[:n] = np.where(better, j, succ[:n])
        for c in np.argsort(self.rank, kind="stable"):
            c = int(c)
            if self.unplaced[c] > 0 and np.isfinite(dist[c]):
                path, node = [], c
                while node != n and len(path) <= n:
                    b = int(succ[node])
                    path.append((node, b, int(via[node, b])))
                    node = b
                if node != n or any(p < 0 for _, _, p in path):
                    continue
                amount = min([int(self.unplaced[c])] + [self._capacity(*e) for e in path])
                if amount > 0:
                    self._apply(path, amount)
                    self.unplaced[c] -= amount
                    return True
        return False
