"""The Plan IR, its file format, its validator and the builders that make plans."""

from treeattn.plan.ir import PLAN_VERSION, Op, OpKind, Plan, TopologyRef, chunk_rows, message_bytes

__all__ = ["PLAN_VERSION", "Op", "OpKind", "Plan", "TopologyRef", "chunk_rows", "message_bytes"]
