"""Fields as `tf` schemas: attributes, and set-nested blocks of at most one element for the
API's nested objects (tf has no single nesting)."""

from __future__ import annotations

import json

from tf import schema, types
from tf.blocks import SetNestedBlock

from gpufleet_tf.fields import Field


def _tf_type(f: Field) -> types.TfType:
    scalar: dict[str, types.TfType] = {
        "string": types.String(),
        "url": types.String(),
        "int": types.Number(),
        "number": types.Number(),
        "bool": types.Bool(),
        "decimal": types.String(),
        "datetime": types.String(),
    }
    if f.type in scalar:
        return scalar[f.type]
    if f.type == "set":
        return types.Set(scalar[f.element])
    if f.type == "list":
        return types.List(scalar[f.element])
    if f.type == "map_string":
        return types.Map(types.String())
    if f.type == "map_number":
        return types.Map(types.Number())
    raise ValueError(f"no Terraform type for {f.type}")


def _described(f: Field) -> str:
    text = f.description
    if f.default is not None and f.default != [] and f.default != {}:
        text += f" API default: `{json.dumps(f.default)}`."
    if f.replace:
        text += " Changing it replaces the object."
    return text.strip()


def attribute(f: Field) -> schema.Attribute:
    return schema.Attribute(
        f.name,
        _tf_type(f),
        description=_described(f) or None,
        required=f.required,
        optional=not f.required,
        requires_replace=f.replace or None,
    )


class OneBlock(SetNestedBlock):
    """A set-nested block that holds at most one element (tf has no single nesting)."""

    def __init__(self, type_name: str, block: schema.Block, max_items: int | None) -> None:
        super().__init__(type_name, block)
        self.max_items = max_items


def schema_parts(
    fields: tuple[Field, ...],
) -> tuple[list[schema.Attribute], list[schema.NestedBlock]]:
    attrs = [attribute(f) for f in fields if f.type != "block"]
    blocks: list[schema.NestedBlock] = []
    for f in fields:
        if f.type == "block":
            inner_attrs, inner_blocks = schema_parts(f.children)
            block = schema.Block(inner_attrs, inner_blocks, description=f.description or None)
            blocks.append(OneBlock(f.name, block, None if f.many else 1))
    return attrs, blocks
