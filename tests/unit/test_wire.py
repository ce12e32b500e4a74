"""The bootstrap's messages (``pydfccl.bootstrap.wire``): plain data as JSON, never pickle."""

import socket

import numpy as np
import pytest

from pydfccl.bootstrap.wire import (MAX_FRAME, WireError, decode, encode, recv_frame,
                                    send_frame)


def test_what_the_bootstrap_sends_comes_back_the_same():
    registrations = {0: {"kind": "all_reduce", "count": 4, "one_shot": True},
                     7: {"kind": "send", "count": 1, "root": 1}}
    for value in [registrations, None, [b"\x00\xff" * 32, ("host", 0)], "shm_name",
                  {("a", 1): [1.5, -2]}, {"#bytes": "not a tag: a dict key"}]:
        assert decode(encode(value)) == value
    assert decode(encode(np.int64(3))) == 3


@pytest.mark.parametrize("value", [object(), {1, 2}, np.zeros(2), lambda: 0])
def test_anything_but_plain_data_is_refused_when_sent(value):
    with pytest.raises(TypeError, match="plain data only"):
        encode(value)


def test_a_pickle_is_not_a_message():
    import pickle

    with pytest.raises(WireError, match="not a bootstrap message"):
        decode(pickle.dumps({"x": 1}))


def test_frames_longer_than_the_limit_are_refused_before_they_are_read():
    a, b = socket.socketpair()
    with a, b:
        a.sendall((MAX_FRAME + 1).to_bytes(4, "big"))
        with pytest.raises(WireError, match="more than"):
            recv_frame(b)
        send_frame(a, b"hello")
        assert recv_frame(b) == b"hello"


class DictStore:
    """The part of a c10d store the bootstrap uses; keys live as long as the store."""

    def __init__(self):
        self.data, self.counters = {}, {}

    def set(self, key, value):
        self.data[key] = value

    def get(self, key):
        return self.data[key]

    def add(self, key, n):
        self.counters[key] = self.counters.get(key, 0) + n
        return self.counters[key]

    def set_timeout(self, timeout):
        pass


def test_a_second_group_over_the_same_store_reads_only_its_own_keys():
    """``destroy_process_group()`` then ``init_process_group()`` again in one process: the
    new group's bootstrap must wait for the new values, never read the old ones."""
    from pydfccl.bootstrap.c10d import C10dStoreGroup

    store = DictStore()
    old = [C10dStoreGroup(store, r, 2) for r in range(2)]
    store.set(f"{old[1]._prefix}/1/1", encode("old 1"))        # rank 1's part of round 1
    assert old[0].allgather("old 0") == ["old 0", "old 1"]
    new = [C10dStoreGroup(store, r, 2) for r in range(2)]
    with pytest.raises(KeyError):          # rank 1 has not sent yet: nothing to read
        new[0].allgather("new 0")
    store.set(f"{new[1]._prefix}/1/1", encode("new 1"))
    new[0]._round = 0
    assert new[0].allgather("new 0") == ["new 0", "new 1"]
    assert not any(v.startswith(b"\x80") for v in store.data.values())   # no pickle
