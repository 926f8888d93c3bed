"""SortedInts: a sorted set of ints kept in short buckets, so insert, remove and search cost a
bisection and a short memmove however many there are (one flat list moves every later element)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Iterator, List, Optional

LOAD = 512  # a bucket splits at twice this


class SortedInts:
    def __init__(self):
        self._lists: List[List[int]] = []
        self._maxes: List[int] = []   # last element of each bucket
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def add(self, x: int) -> None:
        maxes, lists = self._maxes, self._lists
        self._len += 1
        if not maxes:
            lists.append([x])
            maxes.append(x)
            return
        i = bisect_left(maxes, x)
        if i == len(maxes):
            i -= 1
            lst = lists[i]
            lst.append(x)
            maxes[i] = x
        else:
            lst = lists[i]
            insort(lst, x)
        if len(lst) > 2 * LOAD:
            lists[i:i + 1] = [lst[:LOAD], lst[LOAD:]]
            maxes[i:i + 1] = [lst[LOAD - 1], lst[-1]]

    def remove(self, x: int) -> None:
        """Remove x, which must be present."""
        i = bisect_left(self._maxes, x)
        if i == len(self._maxes):
            raise KeyError(x)
        lst = self._lists[i]
        j = bisect_left(lst, x)
        if lst[j] != x:
            raise KeyError(x)
        del lst[j]
        self._len -= 1
        if not lst:
            del self._lists[i], self._maxes[i]
        elif j == len(lst):
            self._maxes[i] = lst[-1]

    def replace(self, old: int, new: int) -> None:
        """Remove old, which must be present, and add new. The policy's usual step (a free block
        shrinks or grows where it is) keeps old's rank: then new overwrites old, no memmove."""
        maxes, lists = self._maxes, self._lists
        i = bisect_left(maxes, old) if len(maxes) > 1 else 0
        if i < len(maxes):
            lst = lists[i]
            j = bisect_left(lst, old)
            if j < len(lst) and lst[j] == old:
                last = j + 1 == len(lst)
                above = (new < lst[j + 1]) if not last else (i + 1 == len(lists) or new < lists[i + 1][0])
                below = (lst[j - 1] < new) if j else (i == 0 or maxes[i - 1] < new)
                if above and below:
                    lst[j] = new
                    if last:
                        maxes[i] = new
                    return
        self.remove(old)
        self.add(new)

    def ceil(self, x: int) -> Optional[int]:
        """The smallest element >= x, or None."""
        i = bisect_left(self._maxes, x)
        if i == len(self._maxes):
            return None
        lst = self._lists[i]
        return lst[bisect_left(lst, x)]

    def floor(self, x: int) -> Optional[int]:
        """The largest element <= x, or None."""
        i = bisect_left(self._maxes, x)
        if i < len(self._maxes):
            lst = self._lists[i]
            j = bisect_right(lst, x)
            if j:
                return lst[j - 1]
        return self._maxes[i - 1] if i else None

    def last(self) -> Optional[int]:
        return self._maxes[-1] if self._maxes else None

    def irange(self, lo: int) -> Iterator[int]:
        """Elements >= lo, ascending."""
        i = bisect_left(self._maxes, lo)
        if i == len(self._maxes):
            return
        lst = self._lists[i]
        yield from lst[bisect_left(lst, lo):]
        for k in range(i + 1, len(self._lists)):
            yield from self._lists[k]

    def descending(self) -> Iterator[int]:
        for lst in reversed(self._lists):
            yield from reversed(lst)

    def __iter__(self) -> Iterator[int]:
        for lst in self._lists:
            yield from lst
