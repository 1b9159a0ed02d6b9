"""Small aiohttp helpers shared by the hf engine's HTTP handlers."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def bad_request(message: str, status: int = 400) -> web.Response:
    return web.json_response(
        {"error": {"message": message}, "success": False, "message": message}, status=status
    )


async def json_or_empty(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
