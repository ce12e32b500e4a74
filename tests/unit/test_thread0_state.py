"""Thread 0's scheduler state: slots generated from one dtype, as the daemon indexes them."""

import numpy as np

from pydfccl.kernels import daemon
from pydfccl.kernels.thread0_state import SLOT, S_WORDS, THREAD0_STATE


def test_slots_are_the_fields_in_order_one_word_each():
    assert list(SLOT) == list(THREAD0_STATE.names)
    assert sorted(SLOT.values()) == list(range(len(SLOT)))      # unique and dense
    assert all(THREAD0_STATE.fields[name][0] == np.int64 for name in SLOT)
    assert all(THREAD0_STATE.fields[name][1] == 8 * i for name, i in SLOT.items())
    assert S_WORDS == THREAD0_STATE.itemsize // 8 == len(SLOT)


def test_the_daemon_names_every_slot_by_its_field():
    named = {k[2:].lower(): v for k, v in vars(daemon).items()
             if k.startswith("S_") and k != "S_WORDS" and isinstance(v, int)}
    assert named == SLOT
    assert daemon.S_WORDS == S_WORDS
