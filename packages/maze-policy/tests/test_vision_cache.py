"""The visual feature cache: same outputs as the model's own path, computed once per frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from maze_env import MazeGame, generate
from maze_env.prompts import feedback_message, initial_messages
from maze_env.render import Renderer, token_aligned_style
from maze_policy.chat import Trajectory
from maze_policy.lora import apply_lora, lora_config
from maze_policy.model import load_vlm
from maze_policy.policy import Policy, sequence_logprobs
from maze_policy.vision_cache import VisionFeatureCache, install_vision_cache


def _episode(policy: Policy, seed: int, moves: list[str]) -> Trajectory:
    maze = generate("7x7", seed)
    r = Renderer(maze, token_aligned_style())
    game = MazeGame.start(maze)
    traj = policy.encoder.start(initial_messages(maze, game.step_budget, renderer=r))
    for word in moves:
        policy.encoder.add_assistant_text(traj, f"<action>{word}</action>")
        res = game.step(word)
        policy.encoder.add_user(traj, feedback_message(res, game.agent, game.steps_left, r))
    return traj


def _uncached_policy(path: Path) -> Policy:
    model, processor = load_vlm(path)
    policy = Policy(model, processor)
    # The model's own batched path: drop the instance attribute the cache installed.
    inner: Any = policy.vision_cache.inner if policy.vision_cache else None
    assert inner is not None
    del inner.__dict__["get_image_features"]
    return policy


def test_cached_features_give_the_model_s_own_logprobs_and_samples(tiny_vlm_dir: Path) -> None:
    cached = Policy(*load_vlm(tiny_vlm_dir))
    plain = _uncached_policy(tiny_vlm_dir)
    cache = cached.vision_cache
    assert isinstance(cache, VisionFeatureCache)
    trajs = [_episode(p, s, ["down", "right", "down"]) for p in (cached,) for s in (1, 2)]
    batch = cached.collate(trajs)
    with torch.no_grad():
        want = sequence_logprobs(plain.model, batch)
        cold = sequence_logprobs(cached.model, batch)
        misses = cache.misses
        warm = sequence_logprobs(cached.model, batch)
    frames = {img.tobytes() for t in trajs for img in t.images}  # a bump repeats a frame
    assert misses == len(frames) < sum(len(t.images) for t in trajs)  # each computed once
    assert cache.misses == misses and cache.hits >= misses  # the second pass read them all
    torch.testing.assert_close(cold, want, rtol=0, atol=1e-6)
    assert torch.equal(cold, warm)
    from maze_policy.sampling import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    a = cached.generate(trajs, params, seed=3)
    b = plain.generate(trajs, params, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_a_learning_vision_tower_bypasses_the_cache_and_changed_weights_clear_it(
    tiny_vlm_dir: Path,
) -> None:
    policy = Policy(*load_vlm(tiny_vlm_dir))  # fresh weights: every parameter requires grad
    cache = policy.vision_cache
    assert cache is not None
    batch = policy.collate([_episode(policy, 3, ["down"])])
    lp = sequence_logprobs(policy.model, batch)
    lp.sum().backward()  # pyright: ignore[reportUnknownMemberType]
    visual = next(p for n, p in policy.model.named_parameters() if "visual.blocks" in n)
    assert visual.grad is not None and cache.misses == 0  # the tower's gradient flowed
    with torch.no_grad():
        before = sequence_logprobs(policy.model, batch)
        n = cache.misses
        visual.add_(0.5)  # an optimizer step would do this in place
        after = sequence_logprobs(policy.model, batch)
    assert cache.misses == 2 * n  # recomputed under the new weights, not read stale
    assert not torch.equal(before, after)


def test_lora_on_the_language_model_keeps_the_tower_cached(tiny_vlm_dir: Path) -> None:
    model, processor = load_vlm(tiny_vlm_dir)
    policy = Policy(apply_lora(model, lora_config(rank=2, alpha=4)), processor)
    assert install_vision_cache(policy.model) is policy.vision_cache  # installed once
    trajs = [_episode(policy, 4, ["down"]), _episode(policy, 4, ["down"])]  # one group's pair
    lp = sequence_logprobs(policy.model, policy.collate(trajs))  # with gradients: LoRA learns
    lp.sum().backward()  # pyright: ignore[reportUnknownMemberType]
    cache = policy.vision_cache
    frames = {img.tobytes() for img in trajs[0].images}
    assert len(frames) == 2  # the start, and one square down
    assert cache is not None and cache.misses == 2 and cache.hits == 2


@pytest.mark.parametrize("padding", ["right", "left"])
def test_logprobs_are_kept_on_generated_tokens_only(tiny_policy: Policy, padding: str) -> None:
    short, long = _episode(tiny_policy, 5, ["up"]), _episode(tiny_policy, 6, ["up", "down"])
    batch = tiny_policy.collate([short, long], padding_side=padding)
    with torch.no_grad():
        lp = sequence_logprobs(tiny_policy.model, batch)
        logits = tiny_policy.model(**batch.model_inputs(), use_cache=False).logits.float()
    mask = batch.loss_mask.bool()
    assert torch.equal(lp[~mask], torch.zeros_like(lp[~mask]))
    rows, cols = mask.nonzero(as_tuple=True)
    full = torch.log_softmax(logits[rows, cols - 1], -1)
    want = full.gather(-1, batch.input_ids[rows, cols][:, None]).squeeze(-1)
    torch.testing.assert_close(lp[mask], want, rtol=0, atol=1e-5)
