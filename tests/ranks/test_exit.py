"""A process that exits with pydfccl's host threads running (a communicator left open)
must stop them before numba-cuda's exit handlers free device and mapped host memory: a
trace drain's device copy during that teardown killed a demo on the H200 (SIGSEGV)."""

import os
import subprocess
import sys
import textwrap


def test_the_pollers_threads_stop_before_earlier_exit_handlers_run():
    script = textwrap.dedent("""
        import atexit

        def last():    # registered first: runs after every handler registered later
            from pydfccl.host.poller import poller
            threads = (poller._thread, poller._tracer_thread)
            print("started:", all(t is not None for t in threads))
            print("alive at exit:", [t.name for t in threads if t is not None and t.is_alive()])

        atexit.register(last)
        from pydfccl.host.poller import poller

        class OpenRank:     # what the two threads use of a rank (a polled.PolledRank)
            submitted, helpers, helped_at = 0, 0, 0.0
            def beat(self, now, force=False): pass
            def needs_polling(self): return False
            def drain_trace(self): pass

        poller.add(OpenRank())
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600)   # 70 s at a load of 20
    assert out.returncode == 0, out.stderr
    assert "started: True" in out.stdout, out.stdout
    assert "alive at exit: []" in out.stdout, out.stdout
