"""The id pool: exact LIFO order, reference counts, permanent ids, double release."""
import pytest

from hybridcache.cache import DoubleFreeError
from hybridcache.cache.id_pool import IdPool


def test_allocation_order_is_exact_and_a_released_id_comes_back_first():
    pool = IdPool(6, permanent=2)
    assert pool.allocate(3) == [2, 3, 4]
    pool.release([3])
    assert pool.allocate(2) == [3, 5]
    assert pool.num_free == 0 and pool.num_owned == 4
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.check()


def test_a_shared_id_is_free_only_after_its_last_release():
    pool = IdPool(4)
    (page,) = pool.allocate(1)
    pool.share([page])
    assert pool.refcount(page) == 2
    pool.release([page])
    assert pool.refcount(page) == 1 and pool.num_free == 3
    pool.release([page])
    assert pool.refcount(page) == 0 and pool.num_free == 4
    pool.check()


def test_bad_releases_and_shares_change_nothing():
    pool = IdPool(4, permanent=1)
    ids = pool.allocate(2)
    for bad in ([ids[0], ids[0]], [0], [3], [7]):
        with pytest.raises(DoubleFreeError):
            pool.release(bad)
    with pytest.raises(DoubleFreeError):
        pool.share([3])
    assert [pool.refcount(i) for i in range(4)] == [0, 1, 1, 0] and pool.num_free == 1
    pool.check()
