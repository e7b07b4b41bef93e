"""Keys given twice in one YAML mapping: PyYAML keeps the last of them without a word, so the
readers of hand-written files (topologies, workloads) refuse them instead."""

from __future__ import annotations

import yaml

__all__ = ["repeated_key", "refusing_repeats"]


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


def refusing_repeats(loader: type) -> type:
    """A subclass of the YAML ``loader`` whose mappings refuse a key given twice while they
    are built (``yaml.constructor.ConstructorError`` at the second key): one parse, where
    ``repeated_key`` walks a composed document again."""

    class _Once(loader):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: set[str] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key.value!r} is given twice", key.start_mark)
                    seen.add(key.value)
            return super().construct_mapping(node, deep)

    _Once.__name__ = f"{loader.__name__}Once"
    return _Once
