"""O(1) allocation of integer ids (pages or slots) with reference counts and permanent ids."""
from __future__ import annotations

from .errors import DoubleFreeError


class IdPool:
    """Ids `0..total-1`; a LIFO free stack, so a just-released id is the next one handed out.

    Ids marked permanent (dummy slots) are never handed out or released.
    """

    def __init__(self, total: int, permanent: int = 0) -> None:
        if total < 0 or not 0 <= permanent <= total:
            raise ValueError(f"bad pool size: total={total}, permanent={permanent}")
        self.total = total
        self.permanent = permanent
        self._refs = [0] * total
        self._free = list(range(total - 1, permanent - 1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_owned(self) -> int:
        return self.total - self.permanent - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` ids; raises MemoryError (changing nothing) when fewer are free."""
        if n > len(self._free):
            raise MemoryError(f"asked for {n} ids, {len(self._free)} free")
        if n == 0:
            return []
        ids = self._free[-n:]
        del self._free[-n:]
        ids.reverse()
        for i in ids:
            self._refs[i] = 1
        return ids

    def share(self, ids: list[int]) -> None:
        """Add one reference to each owned id (a second owner of the same page)."""
        for i in ids:
            if self._refs[i] < 1 or i < self.permanent:
                raise DoubleFreeError(f"id {i} is not owned; it cannot be shared")
        for i in ids:
            self._refs[i] += 1

    def release(self, ids: list[int]) -> None:
        """Drop one reference from each id; ids reaching zero return to the free stack."""
        seen: dict[int, int] = {}
        for i in ids:
            seen[i] = seen.get(i, 0) + 1
            if i < self.permanent or not 0 <= i < self.total or self._refs[i] < seen[i]:
                raise DoubleFreeError(f"id {i} released more often than taken")
        for i in reversed(ids):
            self._refs[i] -= 1
            if self._refs[i] == 0:
                self._free.append(i)

    def refcount(self, i: int) -> int:
        return self._refs[i]

    def check(self) -> None:
        """free + owned + permanent == total; no id both free and referenced, none listed twice."""
        free = set(self._free)
        assert len(free) == len(self._free), "an id is on the free stack twice"
        assert all(self.permanent <= i < self.total for i in free), "a permanent or foreign id is free"
        for i in range(self.permanent, self.total):
            assert (i in free) == (self._refs[i] == 0), f"id {i}: free={i in free}, refs={self._refs[i]}"
        owned = sum(1 for i in range(self.permanent, self.total) if self._refs[i] > 0)
        assert len(free) + owned + self.permanent == self.total

    def owned_ids(self) -> list[int]:
        return [i for i in range(self.permanent, self.total) if self._refs[i] > 0]
