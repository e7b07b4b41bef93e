"""The order a plan's ranks issue operations on their NCCL pair communicators, and whether it
can deadlock.

On NCCL every pair of ranks that exchanges messages has a communicator of its own
(``Comm.open_pairs``); a step posts one group per peer, in ascending peer rank
(``Comm.post``), and leaves out empty messages. NCCL requires operations on different
communicators to be issued in one order on every rank, or they may deadlock (its user guide,
"Using multiple NCCL communicators concurrently"): a rank's kernels run one after another,
and each waits for its peer's. Two ranks share one communicator, so the condition is global:
some single order of all the operations must agree with the order each rank issues its own
in. A plan whose transfers have both sides in one step (every builder's) is issued by step,
then by pair, on every rank, which is such an order; a plan whose transfers straddle steps
can be valid and still issue in a cycle.
"""

from __future__ import annotations

from treeattn.plan.ir import OpKind, Plan, message_bytes

__all__ = ["issue_orders", "issue_cycle", "nccl_order_problem", "WORLD"]

Pair = tuple[int, int]
WORLD: Pair = (-1, -1)
"""The communicator of every rank, which a plan's library collectives run on."""


def issue_orders(plan: Plan) -> list[list[Pair]]:
    """Per rank, the communicators it issues operations on, in order: per step, each peer it
    has a non-empty message with, once, in ascending rank, as the pair (min, max); a step's
    library collective on ``WORLD``."""
    out = []
    for rank, prog in enumerate(plan.programs):
        order: list[Pair] = []
        step, peers = None, set()
        for op in (*prog, None):
            if op is None or op.step != step:
                order += sorted((min(rank, q), max(rank, q)) for q in peers)
                if op is None:
                    break
                step, peers = op.step, set()
            if op.kind is OpKind.COLLECTIVE:
                order.append(WORLD)
            elif op.is_transfer and message_bytes(plan, op):
                peers.add(op.peer)
        out.append(order)
    return out


def issue_cycle(orders: list[list[Pair]]) -> list[tuple[Pair, int]] | None:
    """A cycle among the operations issued (node: the k-th operation on a communicator; edge:
    a rank issues one node right before another), or None when some single order of all of
    them agrees with every rank's."""
    after: dict[tuple[Pair, int], set[tuple[Pair, int]]] = {}
    for order in orders:
        seen: dict[Pair, int] = {}
        prev = None
        for pair in order:
            node = (pair, seen.get(pair, 0))
            seen[pair] = node[1] + 1
            after.setdefault(node, set())
            if prev is not None:
                after[prev].add(node)
            prev = node
    state: dict[tuple[Pair, int], int] = {}  # 1: on the current path, 2: done
    for start in sorted(after):
        if start in state:
            continue
        # depth first without recursion (plans of thousands of steps): (node, its successors left)
        path: list[tuple[Pair, int]] = [start]
        todo = [iter(sorted(after[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(after[nxt])))
    return None


def nccl_order_problem(plan: Plan) -> str | None:
    """Why ``plan`` could deadlock on NCCL's pair communicators (``issue_cycle``), or None."""
    found = issue_cycle(issue_orders(plan))
    if found is None:
        return None
    names = [("all ranks" if pair == WORLD else f"ranks {pair[0]}-{pair[1]}") for pair, _ in found]
    return (f"plan {plan.algorithm!r}: on NCCL its ranks would issue operations on their communicators in a "
            f"cycle ({' -> '.join([*names, names[0]])}: each issued after the one before it by a rank they "
            "share), which can deadlock; put both sides of each transfer in one step")
