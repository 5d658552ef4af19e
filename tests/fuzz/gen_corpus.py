#!/usr/bin/env python3
"""Writes the seed corpus of the differential fuzzer (tests/fuzz/corpus/).

Each scenario is written with named handles; Seq tracks the driver's handle
array (new handles at the end, a dropped one replaced by the last) to turn
names into indices. The encoding is documented in driver.h; the opcodes and
argument counts come from ops.def, which the driver reads too. The files are
committed: rerun this only to change the corpus.

Every scenario that runs a backward is written twice: as it is, its
backwards without an executor (W 0), and as NN-name-wW, every backward with
the executor W (driver.h), W taken in turn from VARIANT_WORKERS; retained
or not as the scenario says. The par_* scenarios choose W for each backward
themselves and have no variant.

    python3 tests/fuzz/gen_corpus.py [out_dir]
"""
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def read_ops(path):
    """ops.def's lines as {NAME: (first code, argument bytes)}, and the
    number of codes, checked as driver.h checks them: the ranges follow one
    another from 0."""
    line_re = re.compile(
        r'OP\(\s*(\w+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*"[^"]*"\s*\)')
    ops, code = {}, 0
    with open(path) as fp:
        for line in fp:
            if not line.startswith("OP("):
                continue
            m = line_re.fullmatch(line.strip())
            assert m, f"ops.def: cannot read {line.strip()}"
            name, first, count, args = m[1], int(m[2]), int(m[3]), int(m[4])
            assert first == code and count >= 1, f"ops.def: {name}'s range"
            ops[name] = (first, args)
            code += count
    assert ops, "ops.def: no OP lines"
    return ops, code


OPS, OPCODES = read_ops(os.path.join(HERE, "ops.def"))

# How a backward runs its steps, its W (driver.h): its last argument byte
# x modulo EXEC_MODES. SEQUENTIAL: no executor; CALLER: one of no workers;
# POOL1..POOL3: libadg's pool of 1..3 threads; DEFERRED: a submit that
# queues until the backward returned; REFUSING: a submit that fails.
(SEQUENTIAL, CALLER, POOL1, POOL2, POOL3, DEFERRED,
 REFUSING) = range(7)
EXEC_MODES = 7
for _op in ("BACKWARD", "BACKWARD_HOOK", "BACKWARD_NEWEST"):
    assert OPS[_op][1] >= 1, f"ops.def: {_op} has no byte x"

# The W of each scenario's variant, in turn: the widest pool most often.
VARIANT_WORKERS = (POOL3, CALLER, POOL1, DEFERRED, POOL3, POOL2, REFUSING)

# Which gradients the ready hook takes (driver.h): none, even ids, ids
# divisible by 3, all.
TAKE_NONE, TAKE_EVEN, TAKE_THIRD, TAKE_ALL = range(4)

# The header's strategy (driver.h).
NONE, BALANCED = 0, 1

# How an op-with's recompute callback ends (driver.h): it builds the
# output, fails with its own code, gives no output, returns a positive
# value, sets an output and then fails with its own code.
BUILDS, FAILS, EMPTY, POSITIVE, SETS_THEN_FAILS = range(5)


class Seq:
    """One input: a method per operation of ops.def, named after it."""

    def __init__(self, strategy=NONE, workers=SEQUENTIAL):
        self.out = bytearray([strategy])  # the header
        self.handles = []
        self.workers = workers  # the W of a backward that names none
        self.backwards = 0

    def _idx(self, name):
        return self.handles.index(name)

    def _emit(self, op, args, parents=()):
        first, n_args = OPS[op]
        assert len(args) == n_args, f"{op} takes {n_args} argument bytes"
        self.out += bytes([first] + list(args) +
                          [self._idx(x) for x in parents])

    def _backward(self, op, args, workers, retain):
        self.backwards += 1
        if workers is None:
            workers = self.workers
        assert 0 <= workers < EXEC_MODES
        # x, the last argument byte (driver.h): W + EXEC_MODES * R.
        self._emit(op, args + [workers + EXEC_MODES * retain])

    def leaf(self, name, v=1):
        self._emit("LEAF", [v])
        self.handles.append(name)

    def op(self, name, parents, fail=False, take=False):
        assert 1 <= len(parents) <= 3
        flags = (7 if fail else 0) + (8 if take else 0)
        self._emit("OP", [len(parents) - 1 + 3 * flags], parents)
        self.handles.append(name)

    def op_with(self, name, parents, value=False, recompute=False,
                memory_bound=False, want_self=False, want=(), gets=True,
                fail=False, take=False, ends=BUILDS, refused=False):
        """adg_op_with. want: the parent slots the step asks for, in the
        order it gets them; refused: the options are invalid, no handle."""
        n = len(parents)
        assert 1 <= n <= 3
        # Bit k of o's wants asks for slot k % n, in the order of k.
        mask, k = 0, 0
        for slot in want:
            while k % n != slot:
                k += 1
            assert k < 3, f"wants {want} on {n} parents"
            mask |= 1 << k
            k += 1
        kind = [[0, 3], [1, 2]][value][recompute]
        o = (kind | memory_bound << 2 | want_self << 3 | mask << 4 |
             (not gets) << 7)
        flags = (7 if fail else 0) + (8 if take else 0) + 16 * ends
        self._emit("OP_WITH", [n - 1 + 3 * flags, o], parents)
        if not refused:
            self.handles.append(name)

    def ref(self, name, new):
        self._emit("REF", [self._idx(name)])
        self.handles.append(new)

    def drop(self, name):
        i = self._idx(name)
        self._emit("DROP", [i])
        self.handles[i] = self.handles[-1]
        self.handles.pop()

    def backward(self, name, seed=0, workers=None, retain=False):
        self._backward("BACKWARD", [self._idx(name), seed], workers, retain)

    def backward_hook(self, name, leaves_only=False, take=TAKE_NONE, seed=0,
                      workers=None, retain=False):
        s = (1 if leaves_only else 0) + 2 * take + 8 * seed
        self._backward("BACKWARD_HOOK", [self._idx(name), s], workers,
                       retain)

    def backward_newest(self, workers=None, retain=False):
        self._backward("BACKWARD_NEWEST", [], workers, retain)

    def retained(self, name, seed=0, workers=None):
        """A retained backward (driver.h: R 1)."""
        self.backward(name, seed, workers, retain=True)

    def stats(self):
        self._emit("STATS", [])

    def graph(self, name):
        self._emit("GRAPH", [self._idx(name)])


# An operation added to ops.def must be given its encoder here.
for _op in OPS:
    assert callable(getattr(Seq, _op.lower(), None)), f"Seq.{_op.lower()}"


def leaves(s, n, prefix="l"):
    for k in range(n):
        s.leaf(f"{prefix}{k}", 2 * k + 1)


SCENARIOS = {}


def scenario(fn=None, strategies=(NONE,)):
    """Registers a scenario: one file per strategy, suffixed with its name
    when there are several."""
    def register(fn):
        for strategy in strategies:
            name = fn.__name__
            if len(strategies) > 1:
                name += ["_none", "_balanced"][strategy]
            SCENARIOS[name] = (fn, strategy)
        return fn
    return register(fn) if fn is not None else register


def parallel(name):
    """Whether a scenario chooses its backwards' W itself (no variant)."""
    return name.startswith("par_")


@scenario
def empty(s):
    pass


@scenario
def leaf_backward(s):
    s.leaf("a", 5)
    s.backward("a", 9)
    s.backward("a", 3)  # leaves are never consumed
    s.stats()


@scenario
def square(s):
    s.leaf("x", 3)
    s.op("y", ["x", "x"])
    s.op("z", ["y", "y", "y"])  # three references on one parent
    s.graph("z")
    s.backward("z", 1)


@scenario
def chain_backward(s):
    leaves(s, 2)
    prev = "l0"
    for k in range(10):
        s.op(f"c{k}", [prev, "l1"])
        prev = f"c{k}"
    s.backward(prev, 7)
    s.graph("c3")


@scenario
def merge_two(s):
    leaves(s, 4)
    s.op("a", ["l0", "l1"])
    s.op("b", ["l2", "l3"])
    s.graph("a")
    s.graph("b")
    s.op("m", ["b", "a"])
    s.graph("b")
    s.stats()
    s.backward("m", 2)


@scenario
def merge_three(s):
    leaves(s, 3)
    s.op("a", ["l0"])
    s.op("b", ["l1"])
    s.op("c", ["l2"])
    s.op("m", ["c", "b", "a"])
    s.graph("a")
    s.backward_newest()


@scenario
def merge_big_graph_later_origin(s):
    # The larger graph has the larger origin: the merged id is still the
    # smallest origin.
    leaves(s, 2)
    s.op("small", ["l0"])
    s.op("big0", ["l1"])
    prev = "big0"
    for k in range(1, 6):
        s.op(f"big{k}", [prev, "l1"])
        prev = f"big{k}"
    s.op("m", [prev, "small"])
    s.graph("big0")
    s.graph("small")
    s.op("n", ["m"])
    s.backward("n", 4)


@scenario
def merge_chain_of_merges(s):
    leaves(s, 6)
    for k in range(6):
        s.op(f"g{k}", [f"l{k}"])
    s.op("m01", ["g0", "g1"])
    s.op("m23", ["g3", "g2"])
    s.op("m45", ["g5", "g4"])
    s.op("all", ["m45", "m23", "m01"])
    s.graph("g5")
    s.backward("all", 1)


@scenario
def backward_twice_consumed(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.backward("a")
    s.backward("a")  # ECONSUMED
    s.graph("a")


@scenario
def unavailable_child(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l1"])
    s.backward("a")  # consumes a only
    s.graph("b")
    s.backward("b")  # EUNAVAILABLE: a was consumed
    s.stats()
    s.drop("b")
    s.drop("a")


@scenario
def parent_consumed_by_child(s):
    leaves(s, 2)
    s.op("a", ["l0"])
    s.op("b", ["a", "l1"])
    s.backward("b")
    s.backward("a")  # ECONSUMED
    s.drop("b")


@scenario
def op_on_consumed_parent(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.backward("a")
    s.op("b", ["a", "l0"])  # a new graph: its parent left its own
    s.graph("b")
    s.op("c", ["b"])
    s.backward("c")  # EUNAVAILABLE through b to a
    s.drop("a")
    s.drop("c")
    s.drop("b")


@scenario
def fail_root(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.op("r", ["a", "l0"], fail=True)
    s.backward("r", 3)
    s.backward("a")  # ECONSUMED: taken by the failed backward
    s.stats()


@scenario
def fail_middle(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2"], fail=True)
    s.op("c", ["b", "a"])
    s.op("d", ["c", "l0"])
    s.drop("a")
    s.drop("b")
    s.backward("d", 5)
    s.drop("c")
    s.drop("d")


@scenario
def fail_two_same_depth(s):
    leaves(s, 2)
    s.op("a", ["l0"], fail=True)
    s.op("b", ["l1"], fail=True)
    s.op("c", ["a", "b"])
    s.backward("c")


@scenario
def fail_then_reuse(s):
    leaves(s, 2)
    s.op("a", ["l0"])
    s.op("b", ["a"], fail=True)
    s.backward("b")
    s.op("c", ["a", "b"])
    s.backward("c")  # EUNAVAILABLE
    s.op("d", ["l1"])
    s.op("e", ["d", "c"])
    s.backward("d")


@scenario
def cascade_root_first(s):
    leaves(s, 2)
    names = []
    prev = "l0"
    for k in range(12):
        s.op(f"c{k}", [prev, "l1"])
        prev = f"c{k}"
        names.append(prev)
    for n in names[:-1]:
        s.drop(n)
    s.stats()
    s.drop(names[-1])  # frees the whole chain
    s.stats()


@scenario
def cascade_leaves_first(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2"])
    s.op("c", ["b", "a", "b"])
    for k in range(3):
        s.drop(f"l{k}")
    s.drop("a")
    s.drop("b")
    s.backward("c", 6)  # leaves freed, their ids still get gradients


@scenario
def cascade_diamond(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a"])
    s.op("c", ["a", "l1"])
    s.op("d", ["b", "c"])
    s.drop("a")
    s.drop("b")
    s.drop("c")
    s.drop("d")
    s.stats()


@scenario
def refs(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.ref("a", "a2")
    s.ref("a2", "a3")
    s.drop("a")
    s.drop("a3")
    s.graph("a2")
    s.ref("l0", "l0b")
    s.drop("l0")
    s.backward("a2", 1)
    s.drop("a2")


@scenario
def diamond_grads(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2"])
    s.op("c", ["a", "a"])
    s.op("d", ["b", "c", "a"])
    s.backward("d", 11)


@scenario
def shared_leaf_two_graphs(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["l0", "l2"])
    s.graph("a")
    s.graph("b")
    s.backward("a", 2)
    s.backward("b", 3)
    s.backward("l0", 4)


@scenario
def take_grad(s):
    leaves(s, 2)
    s.op("a", ["l0", "l1"], take=True)
    s.op("b", ["a", "l0"], take=True)
    s.op("c", ["b", "a"])
    s.backward("c", 1)
    s.op("d", ["l1"], fail=True, take=True)
    s.backward("d", 2)


@scenario
def partial_then_merge(s):
    leaves(s, 3)
    s.op("a", ["l0"])
    s.op("b", ["a"])
    s.op("c", ["l1"])
    s.backward("a")  # a consumed; b stays in graph of origin a
    s.graph("b")
    s.op("m", ["b", "c", "a"])
    s.graph("c")
    s.backward("m")  # EUNAVAILABLE through b
    s.op("n", ["c", "l2"])
    s.backward("n")


@scenario
def dropped_consumed_kept_by_child(s):
    leaves(s, 1)
    s.op("a", ["l0"])
    s.backward("a")
    s.op("b", ["a"])
    s.drop("a")  # a lives on: b holds it
    s.stats()
    s.drop("b")
    s.stats()


@scenario
def kept_by_unavailable_child(s):
    # y can never run again (d's backward needs consumed a), yet d's
    # reference keeps y and its step until d goes.
    leaves(s, 2)
    s.op("a", ["l0"])
    s.backward("a")
    s.op("y", ["l1"])
    s.op("d", ["y", "a"])
    s.drop("y")
    s.stats()
    s.backward("d")  # EUNAVAILABLE
    s.drop("d")  # frees d and y, y's step unrun
    s.stats()


@scenario
def hook_all(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2"])
    s.op("c", ["a", "a"])
    s.op("d", ["b", "c", "l0"])
    s.backward_hook("d", seed=3)


@scenario
def hook_leaves_only_takes(s):
    leaves(s, 4)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2", "l3"])
    s.op("c", ["b", "l1"])
    s.backward_hook("c", leaves_only=True, take=TAKE_EVEN, seed=5)


@scenario
def hook_takes_nodes(s):
    # Taking a node's gradient starves its step: the leaves behind it get
    # none, and the hook sees them without one.
    leaves(s, 3)
    s.op("a", ["l0"])  # id 4
    s.op("b", ["a", "l1"])  # id 5
    s.op("c", ["b", "a", "l2"])  # id 6
    s.op("d", ["c"])  # id 7
    s.backward_hook("d", take=TAKE_EVEN)
    s.op("e", ["l1", "l2"])
    s.backward_hook("e", take=TAKE_ALL)  # even the seed


@scenario
def hook_leaf_root_and_errors(s):
    leaves(s, 2)
    s.backward_hook("l0", take=TAKE_ALL)  # a leaf root, taken: empty
    s.backward_hook("l1", take=TAKE_THIRD)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a"], fail=True)
    s.op("c", ["b", "l1"])
    s.backward_hook("c", seed=2)  # the step of b fails
    s.backward_hook("c")  # ECONSUMED
    s.op("d", ["c"])
    s.backward_hook("d")  # EUNAVAILABLE


@scenario
def many_handles(s):
    leaves(s, 8)
    k = 0
    while len(s.handles) < 64:
        s.op(f"n{k}", [f"l{k % 8}", s.handles[-1], s.handles[k % 5]])
        k += 1
    s.leaf("ignored")  # skipped: the handle array is full
    s.handles.pop()
    s.backward_newest()
    s.stats()


@scenario
def long_chain(s):
    s.leaf("x", 1)
    prev = "x"
    for k in range(200):
        s.op(f"c{k}", [prev, "x"] if k % 3 == 0 else [prev])
        if prev != "x":
            s.drop(prev)
        prev = f"c{k}"
    s.stats()
    s.drop(prev)  # frees 200 nodes in one cascade
    s.stats()


@scenario
def training_loop(s):
    leaves(s, 4, "p")
    for it in range(6):
        s.op("x0", ["p0", "p1"])
        prev = "x0"
        for k in range(1, 6):
            s.op(f"x{k}", [prev, f"p{k % 4}"])
            s.drop(prev)
            prev = f"x{k}"
        s.backward(prev, it)
        s.drop(prev)
        s.stats()


@scenario
def stats_and_graph_queries(s):
    s.stats()
    leaves(s, 2)
    s.graph("l0")
    s.op("a", ["l0"])
    s.graph("a")
    s.stats()
    s.op("b", ["l1"])
    s.op("c", ["a", "b"])
    s.graph("a")
    s.graph("b")
    s.graph("c")
    s.backward("c")
    s.graph("c")
    s.stats()


# ---- Checkpointing (adg_op_with). Values are kept, rebuilt or both;
# memory-bound ones with a recompute callback are what the balanced
# strategy drops at once.


def mem_add(s, name, parent, **kw):
    """An activation: value, recompute, memory-bound."""
    s.op_with(name, [parent], value=True, recompute=True, memory_bound=True,
              **kw)


@scenario(strategies=(NONE, BALANCED))
def ckpt_chain(s):
    # y asks for the end of a chain of adds. None keeps every value and
    # frees those no step asks for when the tape is taken; balanced dropped
    # the adds' and rebuilds each once, freeing each parent's as soon as
    # its child is rebuilt.
    leaves(s, 3)
    s.op_with("c0", ["l0", "l1"], value=True)
    prev = "c0"
    for k in range(1, 7):
        mem_add(s, f"m{k}", prev)
        prev = f"m{k}"
    s.op_with("y", [prev, "l2"], value=True, want=[0])
    s.backward("y", 3)


@scenario(strategies=(NONE, BALANCED))
def ckpt_diamond_rebuilt_once(s):
    # r offers a recompute only: two steps ask for it, it is built once.
    leaves(s, 4)
    s.op_with("c0", ["l0", "l1"], value=True)
    s.op_with("r", ["c0"], recompute=True, memory_bound=True)
    s.op_with("y1", ["r", "l2"], value=True, want=[0])
    s.op_with("y2", ["r", "l3"], value=True, want=[0])
    s.op("z", ["y1", "y2"])
    s.backward("z", 1)


@scenario(strategies=(NONE, BALANCED))
def ckpt_own_output_and_repeats(s):
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True, want_self=True)
    # x * x asking for both slots (one parent) and for its own output.
    s.op_with("sq", ["a", "a"], value=True, recompute=True,
              memory_bound=True, want_self=True, want=[0, 1])
    # One parent asked for three times.
    s.op_with("b", ["sq"], recompute=True, want=[0, 0, 0])
    s.op_with("c", ["b", "sq", "l1"], value=True, want=[1], want_self=True)
    s.backward("c", 5)


@scenario(strategies=(NONE, BALANCED))
def ckpt_skipped_gets(s):
    # y asks for m and never gets it. Balanced: m's rebuild never happens,
    # and c0's output, which it would have needed, stays to the end of the
    # backward. None: m's kept value goes when y returns.
    leaves(s, 2)
    s.op_with("c0", ["l0", "l1"], value=True)
    mem_add(s, "m", "c0")
    s.op_with("y", ["m", "l1"], want=[0], gets=False)
    s.op("z", ["y"])
    s.backward("z", 2)


@scenario
def ckpt_refused_options(s):
    leaves(s, 2)
    s.op("plain", ["l0", "l1"])
    s.op_with("a", ["l0", "l1"], value=True)
    s.op_with("x", ["l0"], want_self=True, refused=True)  # offers nothing
    s.op_with("x", ["a", "l0"], value=True, want=[1], refused=True)  # leaf
    s.op_with("x", ["plain", "a"], want=[0], refused=True)  # offers none
    s.op_with("x", ["a", "plain"], recompute=True, refused=True)
    s.op_with("x", ["l0", "plain"], value=True, recompute=True, want=[0],
              refused=True)
    # Fine: a recompute needs nothing of leaves. Its id comes right after
    # a's: the refused calls used none.
    s.op_with("x", ["a", "l1"], value=True, recompute=True, want=[0])
    s.backward("x", 1)


@scenario(strategies=(NONE, BALANCED))
def ckpt_consumed_parent_offers(s):
    # A consumed parent still offers its output: adg_op_with asking for it
    # succeeds, and a backward that needs the parent is unavailable.
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True, recompute=True,
              memory_bound=True)
    s.backward("a")
    s.op_with("b", ["a", "l1"], value=True, want=[0])
    s.op_with("c", ["a"], recompute=True, memory_bound=True)
    s.backward("b")  # EUNAVAILABLE
    s.op("d", ["c", "b"])
    s.backward("d")  # EUNAVAILABLE
    s.drop("b")  # b lives on in d
    s.drop("d")  # frees d, b and c unrun, with b's output
    s.stats()


@scenario(strategies=(NONE, BALANCED))
def ckpt_failing_step(s):
    # m2's step fails: the outputs still held (c0's and m1's, which their
    # own steps would have asked for) are freed once at the end.
    leaves(s, 2)
    s.op_with("c0", ["l0", "l1"], value=True, want_self=True)
    mem_add(s, "m1", "c0", want_self=True)
    mem_add(s, "m2", "m1", fail=True)
    mem_add(s, "m3", "m2")
    mem_add(s, "m4", "m3")
    s.op_with("y", ["m4", "l1"], value=True, want=[0])
    s.op_with("z", ["y", "m3"], want=[0, 1])
    s.backward("z", 4)
    s.backward("m1")  # ECONSUMED


@scenario(strategies=(BALANCED,))
def ckpt_recompute_ends_badly(s):
    # One graph per way a recompute can end badly: its own code, no
    # output, a positive value, an output and then its own code (libadg
    # frees that output); then one where a parent's rebuild fails on the
    # way. The get fails with that code, and so does the backward.
    leaves(s, 2)
    for k, ends in enumerate((FAILS, EMPTY, POSITIVE, SETS_THEN_FAILS)):
        s.op_with(f"c{k}", ["l0", "l1"], value=True)
        mem_add(s, f"m{k}", f"c{k}")
        s.op_with(f"r{k}", [f"m{k}", "l1"], recompute=True, ends=ends)
        s.op_with(f"y{k}", [f"r{k}", "l0"], want=[0])
        s.backward(f"y{k}", k)
    s.op_with("c", ["l0"], value=True)
    mem_add(s, "m", "c", ends=FAILS)
    s.op_with("r", ["m"], recompute=True)
    s.op_with("y", ["r", "m"], want=[0, 1])
    s.backward("y")


@scenario(strategies=(NONE, BALANCED))
def ckpt_freed_unrun(s):
    # Outputs go with their nodes when a graph is dropped without a
    # backward.
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True)
    mem_add(s, "b", "a", want=[0])
    s.op_with("c", ["b", "a"], recompute=True, want_self=True)
    s.drop("a")
    s.drop("b")
    s.stats()
    s.drop("c")
    s.stats()


@scenario(strategies=(BALANCED,))
def ckpt_merge(s):
    # Outputs follow their nodes through a merge: two checkpointed chains
    # in graphs of their own, joined by an op that asks for both ends.
    leaves(s, 2)
    for h in range(2):
        s.op_with(f"c{h}", [f"l{h}", f"l{h}"], value=True)
        prev = f"c{h}"
        for k in range(3):
            mem_add(s, f"m{h}{k}", prev)
            prev = f"m{h}{k}"
    s.op_with("z", ["m02", "m12"], want=[0, 1])
    s.graph("c0")
    s.backward("z", 1)


@scenario(strategies=(NONE, BALANCED))
def ckpt_rebuilt_from_two(s):
    # j is rebuilt from two outputs, one of them rebuilt too, and a leaf;
    # k is memory-bound but cannot rebuild itself: both strategies keep
    # it.
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True)
    s.op_with("k", ["l1", "l0"], value=True, memory_bound=True)
    mem_add(s, "b", "a")
    s.op_with("j", ["k", "l0", "b"], value=True, recompute=True,
              memory_bound=True)
    s.op_with("y", ["j", "k"], want=[0, 1])
    s.backward("y", 6)


@scenario(strategies=(BALANCED,))
def ckpt_hook_takes(s):
    # The hook takes gradients: the steps it starves still get their
    # outputs, and give nothing.
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True, want_self=True)
    s.op_with("b", ["a", "l1"], recompute=True, memory_bound=True,
              want=[0], want_self=True, take=True)
    s.op_with("c", ["b"], value=True, want=[0])
    s.backward_hook("c", take=TAKE_EVEN, seed=2)
    s.op_with("d", ["l0", "l1"], recompute=True, want_self=True)
    s.backward_hook("d", take=TAKE_ALL)


@scenario(strategies=(NONE, BALANCED))
def ckpt_training_loop(s):
    # Forward with checkpointed activations, backward, drop; six times.
    leaves(s, 3, "p")
    for it in range(6):
        s.op_with("x0", ["p0", "p1"], value=True)
        prev = "x0"
        for k in range(1, 5):
            if k % 2:
                mem_add(s, f"x{k}", prev)
            else:
                s.op_with(f"x{k}", [prev, f"p{k % 3}"], value=True,
                          want=[0])
            s.drop(prev)
            prev = f"x{k}"
        s.backward(prev, it)
        s.drop(prev)
        s.stats()


# ---- Backwards with an executor (W above 0, driver.h): steps of
# independent branches run at once, in an order that depends on timing,
# and the results must still be the sequential backward's. Each of these
# builds a graph of a given shape again for each W.

EXECUTORS = (CALLER, POOL1, POOL2, POOL3, DEFERRED, REFUSING)


def wide_tree(s, tag, n_leaves=4, chains=8, length=5, fail=()):
    """chains chains of length ops on the leaves, joined in a tree of up to
    three parents an op: branches that can run at once. fail: (chain, k)
    pairs whose step fails. Returns the root and the names to drop."""
    names = []
    ends = []
    for c in range(chains):
        prev = f"l{c % n_leaves}"
        for k in range(length):
            name = f"{tag}c{c}_{k}"
            parents = [prev, f"l{(c + k) % n_leaves}"] if k % 2 else [prev]
            s.op(name, parents, fail=(c, k) in fail)
            names.append(name)
            prev = name
        ends.append(prev)
    level = 0
    while len(ends) > 1:
        joined = []
        for j in range(0, len(ends), 3):
            name = f"{tag}j{level}_{j}"
            s.op(name, ends[j:j + 3])
            names.append(name)
            joined.append(name)
        ends = joined
        level += 1
    return ends[0], names


def drop_all(s, names):
    for name in names:
        s.drop(name)


@scenario
def par_wide_tree(s):
    leaves(s, 4)
    for k, w in enumerate(EXECUTORS):
        root, names = wide_tree(s, f"w{w}")
        s.backward(root, 3 + k, workers=w)
        drop_all(s, names)
    s.stats()


@scenario
def par_wide_tree_hook(s):
    # The hook runs on the worker whose step made a gradient final: for
    # several ids at once, each once, taking some.
    leaves(s, 4)
    for k, w in enumerate(EXECUTORS):
        root, names = wide_tree(s, f"w{w}")
        s.backward_hook(root, leaves_only=k % 2 == 1, take=k % 4,
                        seed=k, workers=w)
        drop_all(s, names)


@scenario
def par_fail_branches(s):
    # Failing steps in several branches at different depths: the result is
    # the one first on the tape's (model.c: the last slot's branch first,
    # each node after its children), however the branches run.
    leaves(s, 4)
    for k, w in enumerate((SEQUENTIAL,) + EXECUTORS):
        root, names = wide_tree(s, f"w{w}", fail={(1, 3), (4, 1), (6, 3)})
        s.backward(root, k, workers=w)
        drop_all(s, names)
    for k, w in enumerate((SEQUENTIAL,) + EXECUTORS):
        root, names = wide_tree(s, f"v{w}", chains=5, length=3,
                                fail={(3, 2), (0, 2)})
        s.backward_hook(root, take=TAKE_EVEN, seed=k, workers=w)
        drop_all(s, names)


@scenario
def par_fail_walk_order(s):
    # a and b fail at the same depth; c names b first, so the walk reaches
    # b first and b's failure is the one reported, though a's id is
    # smaller: without an executor b runs first, with one it is the first
    # on the tape.
    leaves(s, 2)
    for w in (SEQUENTIAL,) + EXECUTORS:
        s.op("a", ["l0"], fail=True)
        s.op("b", ["l1"], fail=True)
        s.op("c", ["b", "a"])
        s.op("d", ["c", "l0"])
        s.backward("d", w, workers=w)
        drop_all(s, ["a", "b", "c", "d"])


@scenario
def par_repeats_and_takes(s):
    # Parents named in several slots (one step gives several gradients
    # for one id), steps that take their gradient, all on shared leaves.
    leaves(s, 3)
    for k, w in enumerate(EXECUTORS):
        names = []
        for b in range(6):
            x = f"x{b}"
            s.op(x, [f"l{b % 3}"] * (1 + b % 3), take=b == 4)
            y = f"y{b}"
            s.op(y, [x, x, f"l{(b + 1) % 3}"], take=b == 1)
            names += [x, y]
        s.op("z0", ["y0", "y1", "y2"])
        s.op("z1", ["y3", "y4", "y5"])
        s.op("r", ["z0", "z1", "z0"])
        names += ["z0", "z1", "r"]
        s.backward("r", k, workers=w)
        drop_all(s, names)


@scenario(strategies=(NONE, BALANCED))
def par_ckpt_shared(s):
    # Branches that ask for the same outputs: r, which only a recompute
    # gives, and the end of a chain that balanced drops; each is built
    # once, whichever branch asks first, and freed once.
    leaves(s, 3)
    for k, w in enumerate(EXECUTORS):
        s.op_with("c0", ["l0", "l1"], value=True)
        mem_add(s, "m1", "c0")
        mem_add(s, "m2", "m1")
        s.op_with("r", ["m2", "l2"], recompute=True, memory_bound=True)
        names = ["c0", "m1", "m2", "r"]
        ys = []
        for b in range(5):
            y = f"y{b}"
            s.op_with(y, ["r", f"l{b % 3}", "m2"], value=True,
                      want=[0] if b % 2 else [0, 2], want_self=b == 3)
            prev = y
            for j in range(b % 3):
                s.op_with(f"{y}_{j}", [prev], value=True, want=[0])
                prev = f"{y}_{j}"
                names.append(prev)
            ys.append(prev)
            names.append(y)
        s.op("z", ys[:3])
        s.op("root", ["z", ys[3], ys[4]])
        names += ["z", "root"]
        if k % 2:
            s.backward_hook("root", take=TAKE_THIRD, seed=k, workers=w)
        else:
            s.backward("root", k, workers=w)
        drop_all(s, names)


@scenario(strategies=(BALANCED,))
def par_ckpt_failing_rebuild(s):
    # Two branches ask for r, whose rebuild fails on the way (m's
    # recompute): both gets fail with m's code, the deeper branch is the
    # first on the tape; then one branch fails on its own, deeper than
    # the get that fails.
    leaves(s, 2)
    for k, w in enumerate((SEQUENTIAL,) + EXECUTORS):
        s.op_with("c", ["l0", "l1"], value=True)
        mem_add(s, "m", "c", ends=FAILS if k % 2 else SETS_THEN_FAILS)
        s.op_with("r", ["m"], recompute=True)
        s.op_with("a", ["r", "l0"], want=[0])
        s.op("a2", ["a"])
        s.op_with("b", ["l1", "r"], want=[1])
        s.op("root", ["a2", "b"])
        s.backward("root", k, workers=w)
        drop_all(s, ["c", "m", "r", "a", "a2", "b", "root"])
    for k, w in enumerate(EXECUTORS):
        s.op_with("c", ["l0", "l1"], value=True)
        mem_add(s, "m", "c", ends=FAILS)
        s.op_with("b", ["l1", "m"], want=[1])
        s.op("a", ["l0"])
        s.op("a1", ["a"], fail=True)
        s.op("a2", ["a1"])
        s.op("root", ["a2", "b"])
        s.backward("root", k, workers=w)
        drop_all(s, ["c", "m", "b", "a", "a1", "a2", "root"])


@scenario(strategies=(BALANCED,))
def par_training_loop(s):
    # A data-parallel trainer: several micro-batches through the same
    # parameters, summed, checkpointed activations, the backward on a
    # different executor each iteration, the hook taking the parameters'
    # gradients as an all-reduce would.
    leaves(s, 3, "p")
    for it, w in enumerate((POOL3,) + EXECUTORS + (SEQUENTIAL, POOL2)):
        outs = []
        names = []
        for mb in range(4):
            x = f"x{mb}"
            s.op_with(x, [f"p{mb % 3}", "p0"], value=True)
            a = f"a{mb}"
            mem_add(s, a, x)
            h = f"h{mb}"
            s.op_with(h, [a, f"p{(mb + 1) % 3}"], value=True, want=[0])
            names += [x, a, h]
            outs.append(h)
        s.op("s0", outs[:2])
        s.op("s1", outs[2:])
        s.op("loss", ["s0", "s1"])
        names += ["s0", "s1", "loss"]
        if it % 2:
            s.backward_hook("loss", leaves_only=True, take=TAKE_ALL,
                            seed=it, workers=w)
        else:
            s.backward("loss", it, workers=w)
        drop_all(s, names)
        s.stats()


@scenario
def par_regress_scratch_reuse(s):
    # Chains one op longer each time, each backward with an executor:
    # every tape needs a little more of the scheduler's scratch than the
    # one before. libadg (par, c0e680d) reused the block when the arrays
    # fit its size but not what is left of it past the cache-line
    # alignment, and wrote up to 63 bytes beyond it (valgrind: invalid
    # write in plan(), parallel.c; ASan's allocator aligns the block, and
    # hides it).
    s.leaf("x", 1)
    for w in (CALLER, POOL1):
        for length in range(1, 10):
            prev = "x"
            names = []
            for k in range(length):
                s.op(f"c{k}", [prev])
                prev = f"c{k}"
                names.append(prev)
            s.backward(prev, length, workers=w)
            drop_all(s, names)


# ---- Retained backward passes (driver.h: R 1): they run the steps and
# take none, so that later passes, retained or consuming, from the same
# root or another node of the graph, run them again with the same
# gradients; outputs they rebuild stay held for those passes.


@scenario
def retain_then_consume(s):
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a", "l2"])
    s.op("c", ["a", "a"])
    s.op("d", ["b", "c", "l0"], take=True)
    s.retained("d", 5)
    s.graph("a")
    s.stats()
    s.retained("d", 5)  # the same gradients again
    s.retained("b", 2)  # another node of the graph
    s.backward_hook("d", take=TAKE_EVEN, seed=3, retain=True)
    s.backward("d", 5)  # consumes the graph
    s.graph("a")
    s.retained("d")  # ECONSUMED
    s.backward("d")  # ECONSUMED


@scenario
def retain_middle_then_consume_it(s):
    # A consuming backward from a node that retained passes ran: the
    # passes from the root after it reach a consumed step.
    leaves(s, 2)
    s.op("a", ["l0"])
    s.op("b", ["a", "l1"])
    s.op("c", ["b", "l0"])
    s.op("e", ["c", "b"])
    s.retained("e", 1)
    s.retained("c", 2)
    s.backward("b", 3)  # consumes b and a
    s.graph("c")
    s.retained("e")  # EUNAVAILABLE
    s.backward("e")  # EUNAVAILABLE, nothing taken
    s.retained("a")  # ECONSUMED
    s.stats()
    s.drop("e")
    s.drop("c")  # c and e freed: their steps released, run or not


@scenario
def retain_grow_and_merge(s):
    # Ops recorded on a graph after a retained pass join it; one merges a
    # second graph; retained and consuming passes from the new root.
    leaves(s, 3)
    s.op("a", ["l0", "l1"])
    s.op("b", ["a"])
    s.retained("b", 4)
    s.op("x", ["l2"])
    s.retained("x", 1)
    s.op("m", ["b", "x", "a"])
    s.graph("x")
    s.retained("m", 2)
    s.retained("b", 6)
    s.backward_newest(retain=True)
    s.backward("m", 7)
    s.stats()


@scenario
def retain_failing_step(s):
    # A failing step fails a retained backward, which leaves every step
    # registered: again, and a consuming one after them.
    leaves(s, 2)
    s.op("a", ["l0", "l1"])
    s.op("f", ["a", "l0"], fail=True)
    s.op("g", ["f", "a"])
    s.retained("g", 1)
    s.retained("g", 2)
    s.retained("a", 3)  # below the failing step: succeeds
    s.stats()
    s.backward("g", 4)  # fails, and releases
    s.stats()


@scenario
def retain_leaf_root_and_drops(s):
    leaves(s, 2)
    s.retained("l0", 3)  # a leaf root: as ever
    s.op("a", ["l0", "l1"])
    s.op("b", ["a"])
    s.retained("b")
    s.drop("l0")
    s.drop("a")
    s.retained("b", 2)  # a dropped leaf's id still gets its gradient
    s.drop("b")  # frees a and b, steps run only retained: released
    s.stats()


@scenario
def retain_hooks(s):
    leaves(s, 3)
    s.op("a", ["l0"])
    s.op("b", ["a", "l1"])
    s.op("c", ["b", "a", "l2"])
    s.op("d", ["c"])
    for take in (TAKE_NONE, TAKE_EVEN, TAKE_THIRD, TAKE_ALL):
        s.backward_hook("d", leaves_only=take % 2 == 1, take=take,
                        seed=take, retain=True)
    s.backward_hook("d", take=TAKE_THIRD)


@scenario(strategies=(NONE, BALANCED))
def ckpt_retain_chain(s):
    # Balanced: the first retained pass rebuilds the chain's outputs and
    # keeps them; the second rebuilds nothing; the consuming one rebuilds
    # nothing and frees them. None: every value is kept to the consuming
    # pass, which frees those no step asks for at once.
    leaves(s, 3)
    s.op_with("c0", ["l0", "l1"], value=True)
    prev = "c0"
    for k in range(1, 5):
        mem_add(s, f"m{k}", prev)
        prev = f"m{k}"
    s.op_with("y", [prev, "l2"], value=True, want=[0], want_self=True)
    s.op_with("z", ["y", "m2"], want=[0, 1])
    s.retained("z", 3)
    s.stats()
    s.retained("z", 3)
    s.retained("m3", 1)
    s.backward("z", 3)
    s.stats()


@scenario(strategies=(NONE, BALANCED))
def ckpt_retain_then_other_root(s):
    # A retained pass from y rebuilds r; a consuming pass from z, which
    # asks for r too, finds it held; then y's graph is gone.
    leaves(s, 2)
    s.op_with("c", ["l0", "l1"], value=True)
    mem_add(s, "m", "c")
    s.op_with("r", ["m", "l1"], recompute=True, memory_bound=True)
    s.op_with("y", ["r"], want=[0])
    s.op_with("z", ["y", "r", "m"], want=[1, 2])
    s.retained("y", 2)
    s.backward("z", 1)
    s.retained("y")  # ECONSUMED


@scenario(strategies=(BALANCED,))
def ckpt_retain_failing_rebuild(s):
    # A recompute fails in a retained pass: the get and the backward fail,
    # what was rebuilt before stays held, nothing is released; the same
    # again, then a consuming pass that fails and frees.
    leaves(s, 2)
    for ends in (FAILS, SETS_THEN_FAILS, EMPTY):
        s.op_with("c", ["l0", "l1"], value=True)
        mem_add(s, "m", "c")
        mem_add(s, "r", "m", ends=ends)
        s.op_with("y", ["m", "r"], want=[0, 1])
        s.retained("y", 1)
        s.retained("y", 2)
        s.backward("y", 3)
        drop_all(s, ["c", "m", "r", "y"])


@scenario(strategies=(NONE, BALANCED))
def ckpt_retain_dropped(s):
    # Outputs a retained pass rebuilt go with their nodes when the graph
    # is dropped without a consuming backward.
    leaves(s, 2)
    s.op_with("a", ["l0", "l1"], value=True)
    mem_add(s, "b", "a")
    s.op_with("c", ["b", "a"], recompute=True, want_self=True, want=[0])
    s.retained("c", 1)
    s.drop("a")
    s.drop("b")
    s.stats()
    s.retained("c", 2)
    s.drop("c")
    s.stats()


@scenario
def par_retain_wide_tree(s):
    # Retained passes on every executor, then a consuming one, each tree
    # run three times.
    leaves(s, 4)
    for k, w in enumerate(EXECUTORS):
        root, names = wide_tree(s, f"w{w}", chains=6, length=4)
        s.retained(root, k, workers=w)
        s.backward_hook(root, take=k % 4, seed=k, workers=w, retain=True)
        s.backward(root, k, workers=w)
        drop_all(s, names)
    s.stats()


@scenario
def par_retain_fail_branches(s):
    leaves(s, 4)
    for k, w in enumerate((SEQUENTIAL,) + EXECUTORS):
        root, names = wide_tree(s, f"w{w}", chains=6, length=4,
                                fail={(1, 3), (4, 1)})
        s.retained(root, k, workers=w)
        s.retained(root, k + 1, workers=w)
        s.backward(root, k, workers=w)
        drop_all(s, names)


@scenario(strategies=(NONE, BALANCED))
def par_retain_ckpt_shared(s):
    # Branches asking for the same rebuilt outputs, in retained passes on
    # two executors, then a consuming one on a third.
    leaves(s, 3)
    modes = [(SEQUENTIAL, POOL3, CALLER), (POOL1, DEFERRED, POOL3),
             (REFUSING, POOL3, POOL2), (POOL3, SEQUENTIAL, POOL1)]
    for k, (w1, w2, w3) in enumerate(modes):
        s.op_with("c0", ["l0", "l1"], value=True)
        mem_add(s, "m1", "c0")
        mem_add(s, "m2", "m1", ends=FAILS if k == 3 else BUILDS)
        s.op_with("r", ["m2", "l2"], recompute=True, memory_bound=True)
        names = ["c0", "m1", "m2", "r"]
        ys = []
        for b in range(4):
            y = f"y{b}"
            s.op_with(y, ["r", f"l{b % 3}", "m1"], value=True,
                      want=[0] if b % 2 else [0, 2], want_self=b == 3)
            ys.append(y)
            names.append(y)
        s.op("root", ys[:3])
        names.append("root")
        s.retained("root", k, workers=w1)
        s.retained(ys[3], k, workers=w2)
        s.retained("root", k, workers=w2)
        s.backward("root", k, workers=w3)
        drop_all(s, names)


@scenario(strategies=(NONE, BALANCED))
def par_retain_pool2_ckpt(s):
    # Retained passes on the pool of 2, which the opcode byte once had no
    # code for: its two workers take branches that ask at once for the
    # same rebuilt outputs (r and q offer a recompute alone; balanced drops
    # m1 and m2 too), each rebuilt once and kept for the passes after,
    # retained or consuming, from the root or a branch. Round by round:
    # all build; m2's rebuild fails (balanced only: none keeps its value);
    # q's sets an output and then fails, under both; a branch's step fails
    # above the shared outputs.
    leaves(s, 3)
    rounds = ((BUILDS, BUILDS, None), (FAILS, BUILDS, None),
              (BUILDS, SETS_THEN_FAILS, None), (BUILDS, BUILDS, 4))
    for k, (m2_ends, q_ends, failing) in enumerate(rounds):
        s.op_with("c0", ["l0", "l1"], value=True)
        mem_add(s, "m1", "c0")
        mem_add(s, "m2", "m1", ends=m2_ends)
        s.op_with("r", ["m2", "l2"], recompute=True, memory_bound=True)
        s.op_with("q", ["r", "m1"], recompute=True, memory_bound=True,
                  ends=q_ends)
        names = ["c0", "m1", "m2", "r", "q"]
        ends = []
        for b in range(6):
            y = f"y{b}"
            s.op_with(y, ["q" if b % 2 else "r", f"l{b % 3}", "m1"],
                      value=True, want=[0] if b % 3 else [0, 2],
                      want_self=b == 5, fail=b == failing)
            names.append(y)
            prev = y
            for j in range(b % 3):
                s.op_with(f"{y}_{j}", [prev, "r"], value=True,
                          want=[0, 1] if j else [1])
                prev = f"{y}_{j}"
                names.append(prev)
            ends.append(prev)
        s.op("z0", ends[:3])
        s.op("z1", ends[3:])
        s.op("root", ["z0", "z1"])
        names += ["z0", "z1", "root"]
        s.retained("root", k, workers=POOL2)
        s.retained("root", k + 1, workers=POOL2)  # rebuilds nothing
        s.backward_hook("y3", take=TAKE_EVEN, seed=k, workers=POOL2,
                        retain=True)
        s.retained("root", k, workers=POOL3)
        s.backward_hook("root", leaves_only=True, take=k % 4, seed=k,
                        workers=POOL2, retain=True)
        s.stats()
        s.backward("root", k, workers=POOL2)
        s.retained("root", workers=POOL2)  # ECONSUMED
        drop_all(s, names)
    s.stats()


def write_random(out_dir):
    rng = random.Random(20240531)
    for k in range(6):
        size = rng.randrange(64, 480)
        data = bytes(rng.randrange(256) for _ in range(size))
        with open(os.path.join(out_dir, f"random-{k}"), "wb") as fp:
            fp.write(data)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, "corpus")
    os.makedirs(out_dir, exist_ok=True)
    variants = 0
    for i, (name, (fn, strategy)) in enumerate(SCENARIOS.items()):
        s = Seq(strategy)
        fn(s)
        path = os.path.join(out_dir, f"{i:02d}-{name.replace('_', '-')}")
        with open(path, "wb") as fp:
            fp.write(bytes(s.out))
        if s.backwards == 0 or parallel(name):
            continue
        # The same, every backward with an executor.
        w = VARIANT_WORKERS[variants % len(VARIANT_WORKERS)]
        variants += 1
        s = Seq(strategy, workers=w)
        fn(s)
        with open(f"{path}-w{w}", "wb") as fp:
            fp.write(bytes(s.out))
    write_random(out_dir)


if __name__ == "__main__":
    main()
