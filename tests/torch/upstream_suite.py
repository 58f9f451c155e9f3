#!/usr/bin/env python3
"""upstream_suite: PyTorch's own torch/testing/_internal/distributed/distributed_test.py (shipped in
the torch 2.x wheel of the project's .venv) run against a backend, as upstream's
test/distributed/test_distributed_spawn.py runs it for gloo: each test spawns WORLD_SIZE processes
that join with a file store.

    COLLD_SOCKET=... PYTHONPATH=build/bindings/torch/python \\
        .venv/bin/python tests/torch/upstream_suite.py --backend colld --world-size 3 [-k PATTERN ...] [--out FILE]
        ... --tests-from tests/torch/upstream_pass.txt [--quick]   (CI: these must pass)

For "colld" the driver (1) adds colld to the feature sets of DistTestCases that name the backends
a generic test runs with (ddp, subgroup, plugin), (2) lifts the gates of the tests that are
generic CPU tests but name their backends (GATES below: the coalesced all-reduce, the object
collectives, the CPU all_to_all and all_to_all_single, the CPU batch_isend_irecv, the get_future
and no_sync DDP tests), and (3) skips the any-source send/recv tests for colld as for NCCL
(colld_recv names its sender); the monitored-barrier and timeout tests stay gloo-only (torch
implements the first for Gloo only; the second test Gloo's own timeout behaviour).
The same driver runs gloo unchanged for the comparison. It prints one line per test (PASS, FAIL,
SKIP with the reason) and a summary; with --out it writes them to a file.

--tests-from FILE runs the tests FILE names (one a line, # comments) and fails unless every one
passes; with --quick only the lines tagged "# quick" (make test: a few of every kind of test;
make test-full, COLLD_TEST_FULL=1: all of them).
"""
import argparse
import importlib.util
import os
import re
import sys
import tempfile
import unittest

# Parsed before anything imports torch's test utilities (they read sys.argv and the environment).
if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="colld")
    ap.add_argument("--world-size", default="3")
    ap.add_argument("-k", action="append", default=[], help="run the tests whose name contains this")
    ap.add_argument("-x", action="append", default=[], help="but not those whose name contains this")
    ap.add_argument("--tests-from", help="run exactly the tests named in this file (one a line; "
                    "# comments); exit 1 unless every one passes")
    ap.add_argument("--quick", action="store_true", help="with --tests-from: only the lines tagged '# quick'")
    ap.add_argument("--fork", action="store_true", help="fork each test's ranks from this process (torch "
                    "imported once) instead of spawning them as upstream's test_distributed_spawn.py does")
    ap.add_argument("--out")
    ARGS = ap.parse_args()
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = ARGS.world_size
    os.environ["COLLD_UPSTREAM_FORK"] = "1" if ARGS.fork else "0"
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="colld-upstream-"))
    sys.argv = sys.argv[:1]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402,F401

# The gates lifted for colld: (test name prefix, text in its decorators, replacement). Each applies
# only to the decorators of the tests whose name starts with the prefix.
GATES = [
    # generic: all_reduce_coalesced, scatter_object_list, DDP's no_sync (gated to Gloo)
    ("test_all_reduce_coalesced", '{"gloo"}', '{"gloo", "colld"}'),
    ("test_scatter_object_list", '{"gloo"}', '{"gloo", "colld"}'),
    ("test_grads_same_across_ranks_with_no_sync", '{"gloo"}', '{"gloo", "colld"}'),
    # all_gather_object and gather_object: byte tensors through all_gather and gather, on the CPU
    # for every backend but NCCL; gated to the backends that also have GPUs
    ("test_all_gather_object", 'backend_feature["gpu"]', 'backend_feature["gpu"] | {"colld"}'),
    ("test_gather_object", 'backend_feature["gpu"]', 'backend_feature["gpu"] | {"colld"}'),
    # all_to_all and all_to_all_single (equal and unequal splits) on the CPU: MPI's only
    ("test_all_to_all", 'BACKEND != "mpi"', 'BACKEND not in ("mpi", "colld")'),
    # batch_isend_irecv on the CPU (and with tags): Gloo's only
    ("test_batch_isend_irecv_gloo", 'BACKEND != "gloo"', 'BACKEND not in ("gloo", "colld")'),
    # the Work's get_future(): "only supported on mpi, nccl and gloo" (the no_sync tests under the
    # same gate are not lifted: their body sets the model up for those three backends only)
    ("test_get_future", 'BACKEND != "gloo",', 'BACKEND != "gloo" and BACKEND != "colld",'),
]


def lift_gates(src):
    """distributed_test.py's source with GATES applied to the decorators of each matching test: the
    lines between its def and the blank line above them (black leaves one between methods)."""
    lines = src.split("\n")
    lifted = set()
    for i, line in enumerate(lines):
        m = re.match(r"\s*def (test_\w+)\(", line)
        gates = [g for g in GATES if m and m.group(1).startswith(g[0])]
        j = i - 1
        while gates and j > 0 and lines[j].strip() and i - j < 30:
            for prefix, old, new in gates:
                if old in lines[j]:
                    lines[j] = lines[j].replace(old, new)
                    lifted.add(prefix)
            j -= 1
    missing = [g[0] for g in GATES if g[0] not in lifted]
    if missing:
        raise SystemExit(f"upstream_suite: no gate found to lift for {missing}: has distributed_test.py changed?")
    return "\n".join(lines)


BACKEND = os.environ["BACKEND"]
if BACKEND == "colld":
    import torch_colld  # noqa: F401,E402  (registers "colld"; also in every spawned rank, which re-imports this file)

    from torch.testing._internal import common_distributed as _cd  # noqa: E402
    for feature in ["ddp", "subgroup", "plugin"]:
        _cd.DistTestCases.backend_feature[feature].add("colld")
    # colld_recv names its sender: no receive from any source, as NCCL (and UCC) there
    _cd.DistTestCases.skip_collective["sendrecv anysource"].add("colld")
    # distributed_test.py with the gates lifted: loaded from its source under its own name, so
    # that everything importing it gets this version.
    _name = "torch.testing._internal.distributed.distributed_test"
    _spec = importlib.util.find_spec(_name)
    _src = lift_gates(open(_spec.origin).read())
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = _mod
    exec(compile(_src, _spec.origin, "exec"), _mod.__dict__)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As upstream's test_distributed_spawn.py (or, with --fork, as its test_distributed_fork.py of
    torch 1.x: each rank a fork of this process, which saves importing torch three times a test)."""

    def setUp(self):
        super().setUp()
        if os.environ.get("COLLD_UPSTREAM_FORK") == "1":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Result(unittest.TextTestResult):
    """Records one line per test."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lines = []

    def _line(self, text):
        self.lines.append(text)
        print(text, file=sys.stderr, flush=True)  # progress while the suite runs

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line(f"PASS {test._testMethodName}")

    @staticmethod
    def _why(err):
        """The last non-empty line of the error: the exception a rank raised."""
        lines = [l.strip() for l in str(err[1]).splitlines() if l.strip()]
        raised = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Exit)\w*:", l)]
        return (raised[-1] if raised else lines[-1] if lines else err[0].__name__)[:300]

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line(f"FAIL {test._testMethodName}: {self._why(err)}")

    def addError(self, test, err):
        super().addError(test, err)
        self._line(f"FAIL {test._testMethodName}: {self._why(err)}")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line(f"SKIP {test._testMethodName}: {reason}")


def main():
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if ARGS.k:
        names = [n for n in names if any(k in n for k in ARGS.k)]
    names = [n for n in names if not any(x in n for x in ARGS.x)]
    want = None
    if ARGS.tests_from:
        with open(ARGS.tests_from) as f:
            lines = [l for l in f if l.split("#")[0].strip()]
        if ARGS.quick:
            lines = [l for l in lines if "#" in l and "quick" in l.split("#", 1)[1]]
        want = [l.split("#")[0].strip() for l in lines]
        missing = [n for n in want if n not in names]
        if missing:
            print(f"not in this torch's suite: {missing}", flush=True)
            return 1
        names = want
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(suite)
    counts = {k: sum(1 for l in result.lines if l.startswith(k)) for k in ["PASS", "FAIL", "SKIP"]}
    summary = f"{BACKEND}, world size {ARGS.world_size}, torch {torch.__version__}: {len(names)} tests: " + \
        ", ".join(f"{v} {k.lower()}" for k, v in counts.items())
    out = sorted(result.lines) + [summary]
    print("\n".join(out), flush=True)
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            f.write("\n".join(out) + "\n")
    if want is not None:  # every listed test must pass, not only not fail
        return 0 if counts["PASS"] == len(want) else 1
    return 0 if counts["FAIL"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
