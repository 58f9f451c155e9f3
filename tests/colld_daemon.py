"""colld_daemon: a colld daemon on a private socket, for the Python tests and benchmarks (tests/torch,
tests/nccl, bench/*.py). Standard library only; scripts outside tests/ put this folder on sys.path.

    p, sock, log = start_daemon(colld, tmp)        # tmp/colld.sock, its log in tmp/colld.log
    ...
    ok = stop_daemon(p, tmp)                       # SIGTERM; False (log printed) if not clean
"""
import os
import signal
import socket
import subprocess
import sys
import time


def start_daemon(colld, tmp, args=(), output=False, timeout=60):
    """Start `colld` (extra `args`) on tmp/colld.sock with its log in tmp/colld.log; return
    (process, socket path, log path) once a client can connect. Its stdout and stderr go nowhere
    unless `output`. Exits the calling script, with the log, if the daemon dies or does not listen
    within `timeout` seconds."""
    sock, log = os.path.join(tmp, "colld.sock"), os.path.join(tmp, "colld.log")
    if os.path.exists(sock):
        os.unlink(sock)
    quiet = None if output else subprocess.DEVNULL
    p = subprocess.Popen([colld, "--socket", sock, "--log-file", log, *args], stdout=quiet, stderr=quiet)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            sys.exit(f"colld exited with {p.returncode}; its log:\n" + open(log).read())
        if os.path.exists(sock):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(sock)
                return p, sock, log
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    p.kill()
    sys.exit(f"colld did not listen within {timeout} s")


def stop_daemon(p, tmp, quiet=False):
    """SIGTERM, then wait (30 s, then kill); True when it exited 0. Otherwise its exit and its log
    are printed, unless `quiet`."""
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = "killed after 30 s"
    if rc != 0 and not quiet:
        print(f"colld exited with {rc}; its log:\n" + open(os.path.join(tmp, "colld.log")).read())
    return rc == 0
