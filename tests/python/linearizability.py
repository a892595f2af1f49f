"""A linearizability checker for histories of a compare-and-set register (the
Wing–Gong search with Lowe's memoization, as in Knossos and porcupine).

A history is a list of `Operation`s on one register, each with the time it was invoked
and the time its answer came back. An operation whose outcome is unknown (a timeout) has
`completed = None`: it may have taken effect at any moment after its invocation, or never.
The history is linearizable when some order of the operations — each placed between its
invocation and its completion, unknown ones anywhere after invocation or not at all —
gives every read the value of the last write before it and makes every compare-and-set
succeed exactly when it was told it did.

Registers are independent, so a history of many keys is checked key by key (P-compositionality).
"""

from dataclasses import dataclass, field
from typing import Optional

INFINITY = float("inf")


@dataclass
class Operation:
    """One client operation on one register.

    kind: "read" (result: the value read, None when absent), "write" (value), or "cas"
    (expected → value; result: True when applied, False when not). `completed` is None
    when the outcome is unknown."""
    kind: str
    invoked: float
    completed: Optional[float]
    value: object = None
    expected: object = None
    result: object = None
    client: int = 0
    index: int = field(default=0, compare=False)


# What `_step` answers when an operation's answer contradicts the register.
IMPOSSIBLE = object()


def _step(state, operation):
    """The register after `operation` from `state`, or IMPOSSIBLE if the operation's
    answer contradicts `state`. Unknown outcomes may apply or not (handled by the caller)."""
    if operation.kind == "read":
        if operation.completed is None:
            return state
        return state if operation.result == state else IMPOSSIBLE
    if operation.kind == "write":
        return operation.value
    if operation.kind == "cas":
        holds = state == operation.expected
        if operation.completed is None:
            return operation.value if holds else state
        if operation.result:
            return operation.value if holds else IMPOSSIBLE
        return state if not holds else IMPOSSIBLE
    raise ValueError(f"unknown operation kind {operation.kind}")


def check(history, initial=None, max_states=2_000_000):
    """True if the history of one register is linearizable from `initial`.

    Raises RuntimeError if the search space exceeds `max_states` (an undecided run must
    not pass silently)."""
    operations = list(history)
    for number, operation in enumerate(operations):
        operation.index = number
    # Unknown reads say nothing; drop them.
    operations = [op for op in operations if not (op.kind == "read" and op.completed is None)]
    count = len(operations)
    deadline = [op.completed if op.completed is not None else INFINITY for op in operations]
    order = sorted(range(count), key=lambda i: operations[i].invoked)
    seen = set()
    explored = 0
    # Depth-first search over (set of linearized operations, register state).
    stack = [(0, initial)]
    while stack:
        done, state = stack.pop()
        if (done, state) in seen:
            continue
        seen.add((done, state))
        explored += 1
        if explored > max_states:
            raise RuntimeError("linearizability search exceeded its bound; shorten the history")
        # Every operation that must have completed is linearized?
        pending = [i for i in order if not done & (1 << i)]
        if all(deadline[i] == INFINITY for i in pending):
            return True
        # The next operation linearized must be invoked before every pending operation
        # with a known completion has completed.
        horizon = min(deadline[i] for i in pending)
        # Unknown operations with the same effect are interchangeable: whichever of them is
        # linearized here, the earliest invoked could be instead (it may take effect at any
        # time after its invocation, as the later one), so only that one is tried.
        # Without this, every unknown operation doubles the states to search.
        unknown_effects_tried = set()
        for i in pending:
            operation = operations[i]
            if operation.invoked > horizon:
                break
            if operation.completed is None:
                effect = (operation.kind, operation.value, operation.expected)
                if effect in unknown_effects_tried:
                    continue
                unknown_effects_tried.add(effect)
            after = _step(state, operation)
            if after is not IMPOSSIBLE:
                stack.append((done | (1 << i), after))
            # An unknown outcome may also never take effect: such an operation is simply
            # left pending (the search ends once only unknown ones are), so there is no
            # branch that marks it done without an effect — that branch would only double
            # the states for every unknown operation.
    return False


def check_all(histories, initial=None):
    """`{key: [Operation]}` → the keys whose histories are not linearizable."""
    return [key for key, history in histories.items() if not check(history, initial)]
