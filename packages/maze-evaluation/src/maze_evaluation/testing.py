"""A scripted OpenAI-compatible chat server on loopback, for tests and smoke checks.

It plays from the pixels like a model would: the latest image in the conversation is decoded
back into a grid (wall, path, goal, agent colours of maze-env's default palette) and the
policy named by the request's ``model`` answers. ``oracle`` follows a BFS shortest path and
stops on the goal; ``bumper`` walks into a wall; ``stopper`` stops at once; ``garbage``
answers with no action; ``looper`` goes back and forth between two squares. ``faults`` makes
the first requests fail with the given HTTP statuses (with ``Retry-After: 0``).
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import numpy as np
from PIL import Image

from maze_env import DIRECTION_DELTAS, Direction, Maze, MazeSpec

POLICIES = ("oracle", "bumper", "stopper", "garbage", "looper")
_SIZE = re.compile(r"Here is a (\d+)x(\d+) maze")
_NAMES = {
    Direction.RIGHT: "right",
    Direction.UP: "up",
    Direction.LEFT: "left",
    Direction.DOWN: "down",
}


def _parts(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return list(cast(Sequence[Mapping[str, Any]], content)) if isinstance(content, list) else []


def read_board(messages: Sequence[Mapping[str, Any]]) -> tuple[Maze, tuple[int, int]]:
    """The maze and the agent's square, from the first task text and the latest image.

    A conversation cut to its latest turn (context ``latest`` or ``route``) has no task text:
    the size then comes from the image itself, whose square (1, 1) is always a cell, never a wall.
    """
    size: tuple[int, int] | None = None
    uri: str | None = None
    for m in messages:
        for p in _parts(m):
            if p.get("type") == "text" and size is None:
                found = _SIZE.search(str(p.get("text", "")))
                if found:
                    size = (int(found.group(1)), int(found.group(2)))
            if p.get("type") == "image_url":
                uri = str(cast(Mapping[str, Any], p["image_url"])["url"])
    if uri is None:
        raise ValueError("conversation has no image")
    png = base64.b64decode(uri.split(",", 1)[1])
    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int32)
    is_wall = np.abs(px - np.array([169, 169, 169])).sum(axis=2) < 30
    if size is None:
        diagonal = is_wall[np.arange(min(px.shape[:2])), np.arange(min(px.shape[:2]))]
        cell = int(np.argmin(diagonal))  # the first pixel of square (1, 1)
        if cell == 0:
            raise ValueError("conversation has no maze size text and its image shows no maze")
        size = (px.shape[0] // cell, px.shape[1] // cell)
    rows, cols = size
    cell = px.shape[0] // rows
    walls = is_wall[cell // 2 :: cell, cell // 2 :: cell][:rows, :cols]
    centres = px[cell // 2 :: cell, cell // 2 :: cell][:rows, :cols]
    agent_mask = (centres[:, :, 2] > 200) & (centres[:, :, 0] < 60)
    goal_mask = (centres[:, :, 0] > 200) & (centres[:, :, 1] < 60)
    ar, ac = (int(v) for v in np.argwhere(agent_mask)[0])
    goals = np.argwhere(goal_mask)
    # The agent disc covers the goal's centre when it stands there.
    goal = (ar, ac) if len(goals) == 0 else (int(goals[0][0]), int(goals[0][1]))
    return Maze(walls=walls, start=(ar, ac), goal=goal, spec=MazeSpec(rows, cols)), (ar, ac)


def _wrap(action: str) -> str:
    return f"<observation>scripted</observation><justification>scripted</justification><action>{action}</action>"


def scripted_reply(policy: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The reply of the scripted ``policy`` to the conversation so far (see the module docs).

    Raises:
        ValueError: ``policy`` is not one of :data:`POLICIES`.
    """
    if policy == "garbage":
        return "I am not sure what to do here."
    if policy == "stopper":
        return _wrap("stop")
    maze, agent = read_board(messages)
    if policy == "oracle":
        actions = maze.optimal_actions
        return _wrap(_NAMES[actions[0]] if actions else "stop")
    open_dirs = [
        d
        for d, (dr, dc) in DIRECTION_DELTAS.items()
        if maze.is_open((agent[0] + dr, agent[1] + dc))
    ]
    if policy == "bumper":
        blocked = [d for d in Direction if d not in open_dirs]
        return _wrap(_NAMES[blocked[0]] if blocked else "stop")
    if policy == "looper":
        # Undo the previous move, else take the first open one: the agent paces between two
        # squares, so every move after the first revisits a square.
        back = {"right": "left", "left": "right", "up": "down", "down": "up"}
        previous = [str(m.get("content")) for m in messages if m.get("role") == "assistant"]
        last = re.search(r"<action>(\w+)</action>", previous[-1]) if previous else None
        if last is not None and previous and len(previous) % 2 == 1:
            return _wrap(back[last.group(1)])
        return _wrap(_NAMES[open_dirs[0]])
    raise ValueError(f"unknown scripted policy {policy!r}; known: {', '.join(POLICIES)}")


class ScriptedServer:
    """``with ScriptedServer() as srv: srv.url`` serves ``POST /v1/chat/completions``."""

    def __init__(
        self,
        faults: Iterable[int] = (),
        delay_s: float = 0.0,
        renderings: Mapping[str, int] | None = None,
    ) -> None:
        self.faults = list(faults)
        self.delay_s = delay_s
        # GET /v1/models lists these models with maze-serve's ``maze_rendering`` field.
        self.renderings = dict(renderings or {})
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                data = [
                    {"id": name, "object": "model", "maze_rendering": {"cell_px": px}}
                    for name, px in outer.renderings.items()
                ]
                return self._send(200, {"object": "list", "data": data})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                with outer._lock:
                    outer.requests += 1
                    outer.bodies.append(body)
                    fault = outer.faults.pop(0) if outer.faults else None
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if fault is not None:
                    return self._send(
                        fault, {"error": {"message": "injected"}}, {"Retry-After": "0"}
                    )
                if outer.delay_s:
                    threading.Event().wait(outer.delay_s)
                try:
                    text = scripted_reply(str(body["model"]), body["messages"])
                except ValueError as exc:
                    return self._send(400, {"error": {"message": str(exc)}})
                return self._send(
                    200,
                    {
                        "id": f"cmpl-{outer.requests}",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                    },
                )

            def _send(
                self, status: int, payload: object, headers: Mapping[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
