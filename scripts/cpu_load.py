"""Run a command beside CPU burners, to see whether it holds on a loaded machine.

    python scripts/cpu_load.py -n 8 -- python -m pytest -q tests/ranks/test_faults.py

starts ``-n`` processes that spin in a loop (at ``--nice``, 0 by default: as greedy as the
command itself), runs the command, then ends the burners, whatever way the command ended
(Ctrl-C too). Prints the load average before and after, and exits with the command's status.
On a 2-core machine, 8 burners bring the load to about 10.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

BURN = "import os, sys; os.nice(int(sys.argv[1]))\nwhile True: pass"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_loaded(command: list[str], burners: int, nice: int) -> int:
    """Run ``command`` beside ``burners`` spinning processes; its exit status."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN, str(nice)])
             for _ in range(burners)]
    try:
        pids = " ".join(str(p.pid) for p in procs)
        print(f"cpu_load: {burners} burners (pids {pids}) at nice {nice}; load {load()}",
              flush=True)
        t0 = time.monotonic()
        status = subprocess.call(command)
        print(f"cpu_load: the command exited with {status} after "
              f"{time.monotonic() - t0:.0f} s; load {load()}", flush=True)
        return status
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--burners", type=int, default=8)
    parser.add_argument("--nice", type=int, default=0, help="the burners' niceness")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run, after --")
    return run_loaded(command, args.burners, args.nice)


if __name__ == "__main__":
    sys.exit(main())
