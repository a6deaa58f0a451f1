"""What the model reads of an MCP tool result: text as is, binary content as placeholders."""

from __future__ import annotations

import json

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)


def result_text(result: CallToolResult) -> str:
    """What the model reads of a tool result: text as is, binary content as short placeholders."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, TextContent):
            has_text = True
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(f"[image: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif isinstance(block, AudioContent):
            parts.append(f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            if isinstance(resource, BlobResourceContents):
                mime_type = resource.mime_type or "application/octet-stream"
                size = _decoded_size(resource.blob)
                parts.append(f"[resource: {resource.uri}, {mime_type}, {size} bytes]")
            else:
                has_text = True
                parts.append(f"[resource: {resource.uri}]\n{resource.text}")
    if not has_text and result.structured_content is not None:
        structured = json.dumps(
            result.structured_content, separators=(",", ":"), ensure_ascii=False, default=str
        )
        parts.insert(0, structured)
    return "\n".join(parts)


def _decoded_size(base64_text: str) -> int:
    padding = len(base64_text) - len(base64_text.rstrip("="))
    return len(base64_text) * 3 // 4 - padding
