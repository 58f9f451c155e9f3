#!/usr/bin/python3
"""upstream_suite: PyTorch's own torch/testing/_internal/distributed/distributed_test.py (shipped by
Debian's python3-torch) run against a backend, as upstream's test/distributed/test_distributed_spawn.py
runs it for gloo: each test spawns WORLD_SIZE processes that join with a file store.

    COLLD_SOCKET=... PYTHONPATH=build/bindings/torch/python \
        /usr/bin/python3 tests/torch/upstream_suite.py --backend colld --world-size 3 [-k PATTERN ...] [--out FILE]
        ... --tests-from tests/torch/upstream_pass.txt     (CI: these must pass)

For "colld" the driver (1) provides an `expecttest` stand-in (torch's common_utils imports it;
Debian does not package it), (2) adds colld to the feature sets of DistTestCases that name the
backends a generic test runs with (ddp, subgroup, plugin), and (3) lifts the gloo-only
`require_backend({"gloo"})` gate of the tests that are generic (coalesced all-reduce,
scatter_object_list), the Gloo-only gate of the CPU batch_isend_irecv tests and the MPI-only gate
of the CPU all_to_all and all_to_all_single tests (equal and unequal splits), and (4) skips the
any-source send/recv tests for colld as for NCCL (colld_recv names its sender); the
monitored-barrier tests stay gloo-only (torch implements that for Gloo).
The same driver runs gloo unchanged for the comparison. It prints one line per test (PASS, FAIL,
SKIP with the reason) and a summary; with --out it writes them to a file.

Note: in torch 1.13 the suite does not check all-reduce values everywhere: it is conformance, not
correctness (test_torch.py carries correctness).
"""
import argparse
import importlib.util
import os
import re
import sys
import tempfile
import types
import unittest

# Parsed before anything imports torch's test utilities (they read sys.argv and the environment).
if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="colld")
    ap.add_argument("--world-size", default="2")
    ap.add_argument("-k", action="append", default=[], help="run the tests whose name contains this")
    ap.add_argument("-x", action="append", default=[], help="but not those whose name contains this")
    ap.add_argument("--tests-from", help="run exactly the tests named in this file (one a line; "
                    "# comments); exit 1 unless every one passes")
    ap.add_argument("--out")
    ARGS = ap.parse_args()
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = ARGS.world_size
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="colld-upstream-"))
    sys.argv = sys.argv[:1]

# The expecttest stand-in: common_utils needs its TestCase and ACCEPT flag only.
_expecttest = types.ModuleType("expecttest")
_expecttest.ACCEPT = False
_expecttest.TestCase = unittest.TestCase
sys.modules.setdefault("expecttest", _expecttest)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402,F401
import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402

# TestDistBackend._run turns on DDP's ReplicatedTensor mode in every rank, which imports
# torch.distributed._shard: with Debian's Python 3.11 that import fails in torch 1.13 (a dataclass
# with a mutable default), failing every DDP test on every backend. Off, for colld and gloo alike.
_rt._set_ddp_with_replicated_tensor = lambda value: None

BACKEND = os.environ["BACKEND"]
if BACKEND == "colld":
    import torch_colld  # noqa: F401,E402  (registers "colld"; also in every spawned rank, which re-imports this file)

    from torch.testing._internal import common_distributed as _cd  # noqa: E402
    for feature in ["ddp", "subgroup", "plugin"]:
        _cd.DistTestCases.backend_feature[feature].add("colld")
    # colld_recv names its sender: no receive from any source, as NCCL (and UCC) there
    _cd.DistTestCases.skip_collective["sendrecv anysource"].add("colld")
    # distributed_test.py with the gloo-only gate lifted for generic tests: loaded from its source
    # under its own name, so that everything importing it gets this version.
    _name = "torch.testing._internal.distributed.distributed_test"
    _spec = importlib.util.find_spec(_name)
    _src = open(_spec.origin).read()
    _generic = ['@require_backend({"gloo"})\n        def test_all_reduce_coalesced',
                '@require_backend({"gloo"})\n        def test_scatter_object_list']
    for g in _generic:
        _src = _src.replace(g, g.replace('{"gloo"}', '{"gloo", "colld"}'))
    _src = _src.replace('@require_backend({"gloo"})\n        @require_backends_available({"gloo"})\n'
                        '        def test_all_reduce_coalesced',
                        '@require_backend({"gloo", "colld"})\n        def test_all_reduce_coalesced')
    # all_to_all and all_to_all_single, equal and unequal splits, on the CPU: colld_alltoallv has them
    _src = re.sub(r'@sandcastle_skip_if\(BACKEND != "mpi", (".*?")\)\n((?:[ ]*@.*\n)*[ ]*def test_all_to_all)',
                  r'@sandcastle_skip_if(BACKEND not in ("mpi", "colld"), \1)\n\2', _src)
    # batch_isend_irecv on the CPU (and with tags): generic, gated to Gloo
    _src = _src.replace('@sandcastle_skip_if(BACKEND != "gloo", "GLOO Batch Send Recv CPU")',
                        '@sandcastle_skip_if(BACKEND not in ("gloo", "colld"), "GLOO Batch Send Recv CPU")')
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = _mod
    exec(compile(_src, _spec.origin, "exec"), _mod.__dict__)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As upstream's test_distributed_spawn.py."""

    def setUp(self):
        super().setUp()
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
            want = [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]
        missing = [n for n in want if n not in names]
        if missing:
            print(f"not in this torch's suite: {missing}", flush=True)
            return 1
        names = want
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(suite)
    counts = {k: sum(1 for l in result.lines if l.startswith(k)) for k in ["PASS", "FAIL", "SKIP"]}
    summary = f"{BACKEND}, world size {ARGS.world_size}: {len(names)} tests: " + \
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
