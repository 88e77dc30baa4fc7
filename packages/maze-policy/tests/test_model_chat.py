from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from maze_env import MazeGame, generate
from maze_env.prompts import feedback_message, initial_messages, oracle_reply
from maze_env.render import Renderer, token_aligned_style
from maze_policy.chat import decode_data_uri
from maze_policy.errors import ChatEncodingError
from maze_policy.policy import Policy


def _episode(spec: str = "7x7", seed: int = 3) -> tuple[Any, Renderer, MazeGame]:
    maze = generate(spec, seed)
    return maze, Renderer(maze, token_aligned_style()), MazeGame.start(maze)


def test_one_visual_token_per_grid_square(tiny_policy: Policy) -> None:
    maze, r, game = _episode("7x7")
    msgs = initial_messages(maze, game.step_budget, renderer=r)
    traj = tiny_policy.encoder.start(msgs)
    (grid,) = traj.image_grid_thw
    assert grid.tolist() == [1, 14, 14]  # 224 px / 16 px patches
    n_pad = traj.input_ids.count(tiny_policy.encoder.image_token_id)
    assert n_pad == int(grid.prod()) // 4 == maze.shape[0] * maze.shape[1]
    assert traj.pixel_values[0].shape == (196, 3 * 2 * 16 * 16)
    assert traj.loss_mask == [0] * len(traj) and traj.num_generated == 0


def test_loss_mask_covers_exactly_assistant_tokens(tiny_policy: Policy) -> None:
    enc = tiny_policy.encoder
    tok: Any = tiny_policy.processor.tokenizer
    maze, r, game = _episode()
    msgs = initial_messages(maze, game.step_budget, renderer=r)
    snapshot = copy.deepcopy(msgs)
    traj = enc.start(msgs)
    replies: list[str] = []
    for word in [d.word for d in maze.optimal_actions[:3]]:
        reply = oracle_reply(game.agent, maze.goal, word)
        replies.append(reply)
        enc.add_assistant_text(traj, reply)
        result = game.step(word)
        enc.add_user(traj, feedback_message(result, game.agent, game.steps_left, r))
    assert msgs == snapshot  # the processor's in-place normalisation did not leak
    spans = traj.generated_spans()
    assert len(spans) == 3
    for (a, b), reply in zip(spans, replies, strict=True):
        assert tok.decode(traj.input_ids[a:b]) == reply + "<|im_end|>"
        assert tok.decode(traj.input_ids[a - 4 : a]).endswith("<|im_start|>assistant\n")
    assert len(traj.images) == len(traj.pixel_values) == 4
    # Incremental encoding == the processor on the whole conversation rendered at once.
    full = [*msgs]
    game2 = MazeGame.start(maze)
    for word, reply in zip([d.word for d in maze.optimal_actions[:3]], replies, strict=True):
        res = game2.step(word)
        full += [
            {"role": "assistant", "content": reply},
            feedback_message(res, game2.agent, game2.steps_left, r),
        ]
    text = tiny_policy.processor.apply_chat_template(  # pyright: ignore[reportAttributeAccessIssue]
        copy.deepcopy(full), tokenize=False, add_generation_prompt=True
    )
    whole = tiny_policy.processor(text=[text], images=traj.images, return_tensors="pt")  # pyright: ignore[reportCallIssue]
    assert whole["input_ids"][0].tolist() == traj.input_ids
    assert torch.equal(whole["pixel_values"], torch.cat(traj.pixel_values))
    assert enc.encode_conversation(full).input_ids == traj.input_ids


def test_bad_inputs_raise_clear_errors(tiny_policy: Policy) -> None:
    enc = tiny_policy.encoder
    with pytest.raises(ChatEncodingError, match="data URI"):
        decode_data_uri("http://example.com/x.png")
    with pytest.raises(ChatEncodingError, match="cannot decode"):
        decode_data_uri("data:image/png;base64,AAAA")
    with pytest.raises(ChatEncodingError, match="end with a user"):
        enc.start([{"role": "system", "content": "x"}])
    traj = enc.start([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatEncodingError, match="placeholder"):
        enc.add_assistant(traj, [enc.image_token_id])
    with pytest.raises(ChatEncodingError, match="logprobs"):
        enc.add_assistant(traj, [5, 6], [0.0])
    with pytest.raises(ChatEncodingError, match="user message"):
        enc.add_user(traj, {"role": "assistant", "content": "x"})


def test_inline_frames_encode_exactly_like_data_uris(tiny_policy: Policy) -> None:
    # The in-process path (PIL frames, no PNG) must give the very tokens and pixels of the
    # OpenAI-message path (PNG data URIs), or training would change.
    enc = tiny_policy.encoder
    maze, r, game = _episode()
    uri = enc.start(initial_messages(maze, game.step_budget, renderer=r))
    inline = enc.start(initial_messages(maze, game.step_budget, renderer=r, inline=True))
    for word in [d.word for d in maze.optimal_actions[:3]]:
        reply = oracle_reply(game.agent, maze.goal, word)
        result = game.step(word)
        for traj, flag in ((uri, False), (inline, True)):
            enc.add_assistant_text(traj, reply)
            msg = feedback_message(result, game.agent, game.steps_left, r, inline=flag)
            assert ("image_url" in msg["content"][0]) is not flag
            enc.add_user(traj, msg)
    assert inline.input_ids == uri.input_ids and inline.loss_mask == uri.loss_mask
    assert len(inline.pixel_values) == len(uri.pixel_values) == 4
    for a, b in zip(inline.pixel_values, uri.pixel_values, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(inline.image_grid_thw, uri.image_grid_thw, strict=True):
        assert torch.equal(a, b)
