"""A tiny MCP server whose one tool waits until a file exists: lets tests hold a run mid-call.

``wait_for_file {path}`` polls for ``path`` (every 10 ms, at most 60 s) and answers
``{"path": ..., "seen": true}``. Run: ``python gate_server.py`` (stdio).
"""

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel

app = MCPServer("gate")


class Seen(BaseModel):
    path: str
    seen: bool


@app.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
async def wait_for_file(path: str) -> Seen:
    """Return once ``path`` exists."""
    flag = anyio.Path(path)
    with anyio.move_on_after(60):
        # Another process creates the file: there is no event to wait on across processes.
        while not await flag.exists():  # noqa: ASYNC110
            await anyio.sleep(0.01)
    return Seen(path=path, seen=await flag.exists())


if __name__ == "__main__":
    app.run()
