"""Drives `taskdaemon mcp` with the official Python MCP SDK and prints what it saw as JSON.

Usage: python3 tests/mcp_client.py BINARY WORKTREE

tests/mcp.rs runs this after writing notes.txt ("hello world\n") and other.txt into WORKTREE,
then asserts on the printed summary and on the files. This script only talks the protocol
and records answers; it judges nothing, so a failing assertion in the Rust test shows the
exact answer the server gave. Works with SDK 1.x (camelCase attributes) and 2.x (snake_case):
every result is read through its wire form (`model_dump(by_alias=True)`).
"""

import asyncio
import json
import sys
import traceback

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def wire(model):
    """The JSON object the server sent, whatever the SDK's attribute naming."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def tool_answer(result):
    """Text and error flag of a CallToolResult."""
    data = wire(result)
    texts = [c.get("text", "") for c in data.get("content", []) if c.get("type") == "text"]
    return {"is_error": bool(data.get("isError", False)), "text": "\n".join(texts)}


async def call(session, name, arguments):
    """A tool answer, or the JSON-RPC error the server sent instead."""
    try:
        return tool_answer(await session.call_tool(name, arguments))
    except Exception as exc:  # the SDK raises McpError (1.x) or MCPError (2.x)
        error = getattr(exc, "error", None)
        if error is None:
            raise
        return {
            "protocol_error": True,
            "code": getattr(error, "code", None),
            "message": getattr(error, "message", str(exc)),
        }


async def run(binary, worktree, summary):
    params = StdioServerParameters(command=binary, args=["mcp", "--worktree", worktree])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = wire(await session.initialize())
            summary["server_name"] = init.get("serverInfo", {}).get("name")
            summary["tools_capability"] = "tools" in init.get("capabilities", {})

            listed = wire(await session.list_tools())
            tools = {t["name"]: t for t in listed.get("tools", [])}
            summary["tools"] = sorted(tools)
            summary["schemas"] = {
                name: tools[name].get("inputSchema")
                for name in ("read_file", "edit_file", "grep")
                if name in tools
            }

            summary["read"] = await call(session, "read_file", {"path": "notes.txt"})
            summary["edit"] = await call(
                session,
                "edit_file",
                {"path": "notes.txt", "old_string": "world", "new_string": "mcp"},
            )
            summary["edit_unread"] = await call(
                session,
                "edit_file",
                {"path": "other.txt", "old_string": "untouched", "new_string": "changed"},
            )
            summary["invalid"] = await call(session, "read_file", {"path": 7})
            summary["unknown"] = await call(session, "no_such_tool", {})


def main():
    if len(sys.argv) != 3:
        print("usage: mcp_client.py BINARY WORKTREE", file=sys.stderr)
        return 2
    summary = {}
    code = 0
    try:
        asyncio.run(run(sys.argv[1], sys.argv[2], summary))
    except BaseException:  # noqa: BLE001 - report whatever stopped the session
        summary["failure"] = traceback.format_exc()
        code = 1
    print(json.dumps(summary, sort_keys=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
