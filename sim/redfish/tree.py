"""A Redfish resource tree read from mockup directories, with live values bound to the rack model.

The resources a simulated service serves are data, not code: mockup
directories laid out as DMTF publishes them (one `index.json` per resource
under `mockups/NAME/`), layered (a tray takes its SessionService, AccountService
and EventService from DMTF's own mockup), and a binding file per service
(`bindings/NAME.yaml`) that says which properties are literal overrides
(`set`), which a client may PATCH (`patch`), and which are read from the rack model at each request (`bind`, a
property path such as `LeakDetectorGroups/0/Detectors/1/DetectorState` and a
term such as `flow * 60000`). `@Redfish.Copyright` is a mockup-only annotation
(DMTF's validator fails a live service that serves it), so it is dropped at load.

Sessions and event subscriptions are live state of the service, not data:
the mockups' sample members under them are not served.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exporters.safe_yaml import InputError, load_yaml_file

HERE = Path(__file__).resolve().parent
MOCKUPS = HERE / "mockups"
BINDINGS = HERE / "bindings"
ROOT = "/redfish/v1/"
# Members of these collections (and of a manager's log) are the service's live state (service.py), never mockup data.
LIVE_COLLECTIONS = ("/redfish/v1/SessionService/Sessions", "/redfish/v1/EventService/Subscriptions")


OMIT = object()  # a term's value that means "this property is absent now" (a broken sensor's DetectorState)


class TreeError(ValueError):
    """A mockup or binding file that does not fit together; the message names the file, URI and property."""


def normalize(path: str) -> str:
    """The key a URI is stored under: no trailing slash, except the service root `/redfish/v1/`."""
    path = path.rstrip("/")
    return ROOT if path == ROOT.rstrip("/") else path


def load_mockup(name: str, only: tuple[str, ...] | None = None) -> dict[str, dict]:
    """URI -> resource body of mockup `name`; `only` keeps the resources under these top-level names."""
    base = MOCKUPS / name
    if not base.is_dir():
        raise TreeError(f"mockup {name!r}: no directory {base}")
    out: dict[str, dict] = {}
    for index in sorted(base.rglob("index.json")):
        rel = index.parent.relative_to(base).as_posix()
        if only is not None and rel.split("/")[0] not in only:
            continue
        uri = ROOT if rel == "." else normalize(ROOT + rel)
        if any(uri.startswith(c + "/") for c in LIVE_COLLECTIONS) or "/LogServices/Log/Entries/" in uri:
            continue
        try:
            body = json.loads(index.read_text())
        except ValueError as exc:
            raise TreeError(f"mockup {name!r}: {index}: {exc}") from None
        body.pop("@Redfish.Copyright", None)
        out[uri] = body
    return out


def _parts(path: str) -> list[str | int]:
    """A property path as JSON Pointer writes it, without the leading slash: `A/0/B` -> ['A', 0, 'B']."""
    return [int(p) if p.isdigit() else p for p in path.split("/")]


def _container(body: Any, parts: list[str | int], where: str) -> Any:
    node = body
    for p in parts[:-1]:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            raise TreeError(f"{where}: no {p!r} in the resource") from None
    if not isinstance(node, (dict, list)):
        raise TreeError(f"{where}: the parent of the property is not an object or array")
    return node


def _put(body: Any, path: str, value: Any, where: str) -> None:
    parts = _parts(path)
    node = _container(body, parts, where)
    last = parts[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or not 0 <= last < len(node):
            raise TreeError(f"{where}: index {last!r} out of range")
    if value is OMIT:
        if isinstance(node, dict):
            node.pop(last, None)
        return
    node[last] = value


@dataclass
class Binding:
    uri: str
    path: str
    term: str
    read: Callable[[], Any]


@dataclass
class Tree:
    """The resources of one service and the bindings that refresh them; `render(uri)` is what a GET returns.

    `writable` lists, per URI, the top-level properties a PATCH may change (the binding files' `patch`
    section); a PATCH is applied whole or not at all, objects merged and everything else replaced, and
    the new value keeps the JSON type of the old one.
    """

    resources: dict[str, dict]
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    writable: dict[str, set[str]] = field(default_factory=dict)

    def patch(self, uri: str, changes: dict[str, Any]) -> tuple[str, str] | None:
        """Apply a PATCH body; (Base message key, message naming the property) with nothing applied, or None."""
        allowed = self.writable.get(uri, set())
        target = self.resources[uri]
        for prop, value in changes.items():
            if prop not in allowed:
                return "PropertyNotWritable", f"The property {prop} is a read only property and cannot be assigned a value."
            if not _same_shape(target.get(prop), value):
                return ("PropertyValueTypeError",
                        f"The value for the property {prop} is of a different type than the property can accept.")
        merged = copy.deepcopy(target)
        for prop, value in changes.items():
            merged[prop] = _merge(merged.get(prop), value)
        self.resources[uri] = merged
        return None

    def render(self, uri: str) -> dict | None:
        body = self.resources.get(uri)
        if body is None:
            return None
        out = copy.deepcopy(body)
        for b in self.bindings.get(uri, ()):
            _put(out, b.path, b.read(), f"{uri} {b.path}")
        return out

    def __contains__(self, uri: str) -> bool:
        return uri in self.resources


def _same_shape(old: Any, new: Any) -> bool:
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k not in old or _same_shape(old[k], v) for k, v in new.items())
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, (int, float)):
        return isinstance(new, (int, float))
    if isinstance(old, list):
        return isinstance(new, list) and (not old or all(_same_shape(old[0], v) for v in new))
    return isinstance(new, type(old)) if old is not None else True


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for k, v in new.items():
            out[k] = _merge(old.get(k), v)
        return out
    return new


def build_tree(layers: list[tuple[str, tuple[str, ...] | None]], binding_files: tuple[str, ...],
               resolve: Callable[[str], Callable[[], Any]]) -> Tree:
    """Stack the mockup layers (later ones win), apply each binding file's `set`, check every `bind` resolves.

    `resolve(term)` returns a reader for a term or raises KeyError; a term that
    does not resolve, or a property path that does not exist in the resource,
    is an error at start-up, naming the binding file, URI and path.
    """
    resources: dict[str, dict] = {}
    for name, only in layers:
        resources.update(load_mockup(name, only))
    bindings: dict[str, list[Binding]] = {}
    writable: dict[str, set[str]] = {}
    for binding_file in binding_files:
        _apply(BINDINGS / f"{binding_file}.yaml", resources, bindings, writable, resolve)
    for uri, body in resources.items():  # a resource is served at its own @odata.id (a mockup slip is set right)
        if normalize(str(body.get("@odata.id", ""))) != uri:
            raise TreeError(f"mockups {', '.join(n for n, _ in layers)}: {uri} has @odata.id {body.get('@odata.id')!r}; "
                            "correct it with a `set` in its binding file")
    return Tree(resources, bindings, writable)


def _apply(path: Path, resources: dict[str, dict], bindings: dict[str, list[Binding]], writable: dict[str, set[str]],
           resolve: Callable[[str], Callable[[], Any]]) -> None:
    try:
        data = load_yaml_file(path, "binding file") or {}  # refuses a key given twice (a lost `set`)
    except InputError as exc:  # names the file and line
        raise TreeError(str(exc)) from None
    unknown = sorted(set(data) - {"set", "bind", "patch"})
    if unknown:
        raise TreeError(f"{path}: unknown section(s) {', '.join(unknown)}; expected set, bind, patch")
    for uri, props in (data.get("patch") or {}).items():
        target = resources.get(normalize(uri))
        if target is None:
            raise TreeError(f"{path}: patch: no resource {uri}")
        missing = [p for p in props if p not in target]
        if missing:
            raise TreeError(f"{path}: patch {uri}: no {', '.join(missing)} in the resource")
        writable.setdefault(normalize(uri), set()).update(props)
    for uri, props in (data.get("set") or {}).items():
        target = resources.get(normalize(uri))
        if target is None:
            raise TreeError(f"{path}: set: no resource {uri}")
        for prop, value in props.items():
            _put(target, prop, value, f"{path}: set {uri} {prop}")
    for uri, props in (data.get("bind") or {}).items():
        key = normalize(uri)
        target = resources.get(key)
        if target is None:
            raise TreeError(f"{path}: bind: no resource {uri}")
        for prop, term in props.items():
            where = f"{path}: bind {uri} {prop}"
            _container(target, _parts(prop), where)
            try:
                read = resolve(str(term))
            except KeyError as exc:
                raise TreeError(f"{where}: unknown term {term!r} ({exc.args[0] if exc.args else ''})") from None
            bindings.setdefault(key, []).append(Binding(key, prop, str(term), read))
