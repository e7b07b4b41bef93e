"""Keys given twice in one YAML mapping: PyYAML keeps the last of them without a word, so the
readers of hand-written files (topologies, workloads) refuse them instead."""

from __future__ import annotations

import yaml

__all__ = ["repeated_key"]


def repeated_key(node: yaml.Node | None) -> yaml.ScalarNode | None:
    """The second of two equal keys of one mapping anywhere under ``node`` (a composed
    document: ``yaml.compose``), or None when every mapping names each key once."""
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        return k
                    seen.add(k.value)
                stack.append(v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return None
