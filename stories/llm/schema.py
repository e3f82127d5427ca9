"""A strict validator for the small JSON-schema subset our tool schemas use.

Supported keywords: `type` (object, array, string, integer, number, boolean), `properties`,
`required`, `additionalProperties` (only `false`; an object schema without it is treated as
closed too), `minLength`/`maxLength`, `minimum`/`maximum`, `items`/`minItems`/`maxItems`,
`enum`, `const`, and `oneOf`/`anyOf` whose branches are objects told apart by the constant of
their `"op"` property (with a generic "exactly one/at least one branch" fallback).

Deliberately stricter than JSON schema in two places, because a model that answers with
whitespace or `true` is not answering: a string with `minLength >= 1` must hold a
non-whitespace character, and booleans are never integers or numbers.

This module has no dependencies so both `stories.state` and `stories.llm.tools` can use it.
"""

from __future__ import annotations

from typing import Any

from .errors import shorten


class SchemaViolation(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
}


def validate(schema: dict[str, Any], value: Any, path: str = "") -> None:
    """Raise `SchemaViolation` naming the first fault, or return None."""
    if "const" in schema and value != schema["const"]:
        raise SchemaViolation(path, f"must be {schema['const']!r}, got {shorten(value)}")
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(str(choice) for choice in schema["enum"])
        raise SchemaViolation(path, f"{shorten(value)} is not one of {choices}")
    for keyword in ("oneOf", "anyOf"):
        if keyword in schema:
            _validate_branches(schema[keyword], value, path, exactly_one=keyword == "oneOf")
    expected = schema.get("type")
    if expected is None:
        return
    if not _is_type(value, expected):
        raise SchemaViolation(path, f"must be {_TYPE_NAMES.get(expected, expected)}, got {json_type_name(value)}")
    if expected == "object":
        _validate_object(schema, value, path)
    elif expected == "array":
        _validate_array(schema, value, path)
    elif expected == "string":
        _validate_string(schema, value, path)
    elif expected in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaViolation(path, f"{value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaViolation(path, f"{value} is above the maximum {schema['maximum']}")


def _validate_object(schema: dict[str, Any], value: dict[str, Any], path: str) -> None:
    properties: dict[str, Any] = schema.get("properties", {})
    for key in value:
        if key not in properties and schema.get("additionalProperties", False) is False:
            raise SchemaViolation(path, f"unknown field {shorten(key)}")
    for key in schema.get("required", []):
        if key not in value:
            raise SchemaViolation(path, f"missing required field {key!r}")
    for key, subschema in properties.items():
        if key in value:
            validate(subschema, value[key], _join(path, key))


def _validate_array(schema: dict[str, Any], value: list[Any], path: str) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise SchemaViolation(path, f"has {len(value)} items, at most {schema['maxItems']} allowed")
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise SchemaViolation(path, f"has {len(value)} items, at least {schema['minItems']} required")
    if "items" in schema:
        for index, item in enumerate(value):
            validate(schema["items"], item, f"{path}[{index}]")


def _validate_string(schema: dict[str, Any], value: str, path: str) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise SchemaViolation(path, f"is {len(value)} characters long, at most {schema['maxLength']} allowed")
    if "minLength" in schema:
        if len(value) < schema["minLength"]:
            raise SchemaViolation(path, f"must be at least {schema['minLength']} characters long")
        if schema["minLength"] >= 1 and not value.strip():
            raise SchemaViolation(path, "must not be blank")


def _validate_branches(branches: list[dict[str, Any]], value: Any, path: str, *, exactly_one: bool) -> None:
    by_op = {_op_of(branch): branch for branch in branches}
    if None not in by_op:
        # Discriminated by "op": the precise error comes from the one branch that applies.
        if not isinstance(value, dict):
            raise SchemaViolation(path, f"must be an object, got {json_type_name(value)}")
        if "op" not in value:
            raise SchemaViolation(path, "missing required field 'op'")
        branch = by_op.get(value["op"]) if isinstance(value["op"], str) else None
        if branch is None:
            raise SchemaViolation(_join(path, "op"), f"unknown op {shorten(value['op'])}")
        validate(branch, value, path)
        return
    matches = 0
    first_error: SchemaViolation | None = None
    for branch in branches:
        try:
            validate(branch, value, path)
        except SchemaViolation as error:
            first_error = first_error or error
        else:
            matches += 1
    if matches == 0:
        raise SchemaViolation(path, f"matches none of the allowed shapes ({first_error.reason if first_error else ''})")
    if exactly_one and matches > 1:
        raise SchemaViolation(path, "matches more than one allowed shape")


def _op_of(branch: dict[str, Any]) -> str | None:
    op = branch.get("properties", {}).get("op", {})
    if "const" in op:
        return op["const"]
    if isinstance(op.get("enum"), list) and len(op["enum"]) == 1:
        return op["enum"][0]
    return None


def _is_type(value: Any, expected: str) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if expected == "integer":
        return isinstance(value, int)
    if expected == "number":
        return isinstance(value, int | float)
    raise ValueError(f"unsupported schema type {expected!r}")


def json_type_name(value: Any) -> str:
    """A JSON value's type in plain words, for error messages (also the bundle importer's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
