"""The three PATCH flavours the API server takes for built-in resources, as pure functions:
JSON merge patch (RFC 7386), strategic merge patch (merge patch where known lists merge by key),
and JSON patch (RFC 6902).

Strategic merge covers the simple cases: lists of containers, env vars, volumes, ports,
conditions and owner references merge by their key; other lists are replaced; `null` deletes a
field. Directives such as `$patch` and `$setElementOrder` are not supported (400).
"""

from __future__ import annotations

from typing import Any

from kube_standin._objects import deep_copy
from kube_standin._status import ApiError

#: Merge key of each list field that strategic merge patch merges element by element.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
}

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    result = deep_copy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch where the lists named in MERGE_KEYS merge by their key instead of being replaced."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    result = deep_copy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise ApiError(400, f"strategic merge patch directive {key} is not supported by the stand-in")
        if value is None:
            result.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = deep_copy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise ApiError(400, f"map: {item!r} does not contain declared merge key: {merge_key}")
        for index, existing in enumerate(merged):
            if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]:
                merged[index] = strategic_merge_patch(existing, item)
                break
        else:
            merged.append(deep_copy(item))
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, f"json patch path {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(422, f"json patch path {path!r} does not exist", reason="Invalid")
    return node


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 `add`, `remove`, `replace`, `test`, `copy` and `move` over a copy of `target`."""
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a list of operations")
    doc = deep_copy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise ApiError(400, f"json patch operation {operation!r} needs 'op' and 'path'")
        op, path = operation["op"], operation["path"]
        if op in ("copy", "move"):
            source = _pointer(operation.get("from", ""))
            value = deep_copy(_get(doc, source, operation.get("from", "")))
            if op == "move":
                doc = _remove(doc, source, operation.get("from", ""))
            doc = _add(doc, _pointer(path), value, path)
        elif op == "add":
            doc = _add(doc, _pointer(path), deep_copy(operation.get("value")), path)
        elif op == "remove":
            doc = _remove(doc, _pointer(path), path)
        elif op == "replace":
            doc = _remove(doc, _pointer(path), path)
            doc = _add(doc, _pointer(path), deep_copy(operation.get("value")), path)
        elif op == "test":
            if _get(doc, _pointer(path), path) != operation.get("value"):
                raise ApiError(422, f"json patch test operation failed at {path!r}", reason="Invalid")
        else:
            raise ApiError(400, f"json patch operation {op!r} is not supported")
    return doc


def _get(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, f"json patch path {path!r} does not exist", reason="Invalid")


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise ApiError(422, f"json patch path {path!r} does not exist", reason="Invalid")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    _get(doc, parts, path)  # 422 when missing
    if not parts:
        return None
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return doc


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> Any:
    """`target` with `patch` applied by the flavour `content_type` names; 415 for any other type."""
    if content_type == MERGE_PATCH:
        return merge_patch(target, patch)
    if content_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge_patch(target, patch)
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    raise ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
    )
