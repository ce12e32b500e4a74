"""The benchmarks' timed loops pause the garbage collector (``pydfccl.host.gcpause``)."""
import gc
import threading

from pydfccl.host.gcpause import gc_paused


def test_the_collector_stays_off_until_the_last_thread_leaves():
    assert gc.isenabled()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with gc_paused():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with gc_paused():
            second_in.set()
            first_out.wait(10)
            seen["after the first left"] = gc.isenabled()
        seen["after both left"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"after the first left": False, "after both left": True}


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
