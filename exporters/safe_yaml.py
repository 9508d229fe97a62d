"""Reading operator files (config, secrets, profiles) with bounded cost, whatever the file holds.

Why not `yaml.safe_load(path.read_text())`: that reads a FIFO forever, reads
/dev/zero until memory runs out, expands a 423-byte alias bomb into a
billion-node document (then validated and echoed in full), recurses until
RecursionError on deep nesting, lets a duplicate key silently win, and turns a non-UTF-8 byte or a 5,000-digit integer
into a traceback. Here each of those is one short `InputError` naming the file
and, where there is one, the line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_YAML_BYTES = 1 << 20  # a rack config is a few KB; a profile tens of KB
MAX_DEPTH = 32  # nesting of mappings/sequences; the config needs 6
MAX_INT_DIGITS = 40  # any field is far below 10**40
MAX_NODES = 100_000  # values in the document once aliases are expanded; a rack config has a few hundred


class InputError(ValueError):
    """A file that cannot be used as it is; the message names the file (and line) and is short."""


def read_text_file(path: Path | str, limit: int, what: str = "file") -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes.

    Opened non-blocking so a FIFO never hangs, checked to be a regular file
    (not /dev/zero, a socket or a directory) before reading, and read at most
    `limit + 1` bytes whatever its size claims.
    """
    path = Path(path)
    name = _short(str(path), 120)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise InputError(f"cannot read {name}: not a valid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{name} is not a regular file (a {what} must be one)")
        if st.st_size > limit:
            raise InputError(f"{name} is {st.st_size} bytes, over the {limit}-byte limit for a {what}")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise InputError(f"{name} is over the {limit}-byte limit for a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None


class _Composer(Composer):
    """Aliases allowed (yaml.safe_dump writes them for shared objects) but their expansion bounded: every
    node's size as if each alias were copied out is known when it is composed, so a "billion laughs"
    fails at the level that crosses MAX_NODES, after a few hundred nodes of work. Nesting is bounded
    too (no recursion to exhaust)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        event = self.peek_event()
        if self.check_event(AliasEvent):
            return super().compose_node(parent, index)  # an anchored node, its size already known
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise InputError(f"line {event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._measure(node, event.start_mark.line + 1)
        return node

    def _measure(self, node: Node | None, line: int) -> None:
        sizes: dict[int, int] = self.__dict__.setdefault("_sizes", {})
        if isinstance(node, MappingNode):
            size = 1 + sum(sizes.get(id(k), 1) + sizes.get(id(v), 1) for k, v in node.value)
        elif isinstance(node, SequenceNode):
            size = 1 + sum(sizes.get(id(v), 1) for v in node.value)
        else:
            size = 1
        if size > MAX_NODES:
            raise InputError(f"line {line}: YAML aliases expand this to more than {MAX_NODES} values")
        sizes[id(node)] = size


class _Constructor(SafeConstructor):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class says so
                continue
            if duplicate:
                raise InputError(f"line {key_node.start_mark.line + 1}: duplicate key {_short(key)}")
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Node) -> int:  # type: ignore[override]
        digits = sum(ch.isalnum() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise InputError(f"line {node.start_mark.line + 1}: integer of {digits} digits is too large")
        return super().construct_yaml_int(node)


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_yaml_int)


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _Composer, _Constructor,
              yaml.resolver.Resolver):
    def __init__(self, stream: str):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _Composer.__init__(self)
        _Constructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else text[:limit] + "..."


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document, safely: InputError naming `source` and the line for anything refused."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"{source}: over the {MAX_YAML_BYTES}-byte limit for a YAML file")
    loader = None
    try:
        loader = _Loader(text)  # the reader already refuses control characters here
        return loader.get_single_data()
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        problem = str(getattr(exc, "problem", None) or exc)[:200]
        raise InputError(f"{source}:{where} not valid YAML: {problem}") from None
    except (RecursionError, ValueError, OverflowError) as exc:  # belt and braces: never a traceback
        raise InputError(f"{source}: cannot parse: {type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(path: Path | str, what: str = "YAML file", limit: int = MAX_YAML_BYTES) -> Any:
    """read_text_file + parse_yaml: the safe replacement for yaml.safe_load(path.read_text())."""
    return parse_yaml(read_text_file(path, limit, what), str(path))
