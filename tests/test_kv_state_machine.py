"""Random interleavings of every KV operation, invariants checked after each step.

The hypothesis machine and the seeded driver share KVWorld (tests/kv_invariants.py),
which the browser test also runs under Pyodide.
"""

import hashlib
import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kv_invariants import PREFIXES, KVWorld, random_tokens, run_random_workload

token_lists = st.one_of(
    st.lists(st.integers(0, 63), max_size=40),
    st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 63), max_size=30))
    .map(lambda t: list(t[0]) + t[1]),
)
index = st.integers(0, 1 << 16)


class KVMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.world = KVWorld()

    @rule(tokens=token_lists)
    def new(self, tokens):
        self.world.new(tokens)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index, tokens=st.lists(st.integers(0, 63), min_size=1, max_size=10))
    def append(self, i, tokens):
        self.world.append(i, tokens)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index)
    def fork(self, i):
        self.world.fork(i)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index)
    def free(self, i):
        self.world.free(i)

    @rule(tokens=token_lists)
    def lookup(self, tokens):
        self.world.lookup(tokens)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index)
    def swap_out(self, i):
        self.world.swap_out(i)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index)
    def swap_in(self, i):
        self.world.swap_in(i)

    @precondition(lambda self: self.world.seqs)
    @rule(i=index, frac=st.floats(0, 1))
    def truncate(self, i, frac):
        self.world.truncate(i, frac)

    @invariant()
    def consistent(self):
        self.world.check()

    def teardown(self):
        self.world.free_all_and_check_no_leak()


KVMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestKVMachine = KVMachine.TestCase


def test_seeded_random_workloads_exercise_every_operation():
    for seed in range(4):
        counts = run_random_workload(seed, 300)
        assert counts["checks"] == 301
        for op in ("new", "append", "fork", "free", "lookup", "hit_blocks", "swap_out",
                   "swap_in", "truncate", "cow_copies", "out_of_blocks", "rejected_bad_input"):
            assert counts[op] > 0, (seed, op, counts)


def test_weak_hash_workload_still_never_returns_wrong_blocks():
    # Only 4 distinct hash values: almost every registration collides.
    def weak(parent, token_ids, ns):
        return hashlib.sha256(bytes([sum(token_ids) % 4])).digest()
    rng = random.Random(7)
    world = KVWorld(hash_fn=weak)
    for _ in range(300):
        if rng.random() < 0.4 or not world.seqs:
            world.new(random_tokens(rng))
        elif rng.random() < 0.5:
            world.lookup(random_tokens(rng, 30))
        else:
            world.free(rng.randrange(len(world.seqs)))
        world.check()
    world.free_all_and_check_no_leak()
    assert world.counts["lookup"] > 50 and world.counts["hit_blocks"] > 0
