"""Keys given twice in one YAML mapping: PyYAML keeps the last of them without a word, so the
readers of hand-written files (topologies, plans, workloads) refuse them instead."""

from __future__ import annotations

import yaml

__all__ = ["RepeatedKeyError", "refusing_repeats"]


class RepeatedKeyError(yaml.constructor.ConstructorError):
    """A mapping names ``key`` a second time, at ``problem_mark``."""

    def __init__(self, key: str, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"key {key!r} is given twice", mark)
        self.key = key


def refusing_repeats(loader: type) -> type:
    """A subclass of the YAML ``loader`` whose mappings raise ``RepeatedKeyError`` at the second
    of two equal keys, while they are built (one parse)."""

    class _Once(loader):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: set[str] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise RepeatedKeyError(key.value, key.start_mark)
                    seen.add(key.value)
            return super().construct_mapping(node, deep)

    _Once.__name__ = f"{loader.__name__}Once"
    return _Once
