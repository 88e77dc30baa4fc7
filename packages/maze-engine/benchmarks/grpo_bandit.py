"""Does the GRPO update move the policy where the reward is learnable? A one-turn bandit.

    uv run python packages/maze-engine/benchmarks/grpo_bandit.py runs/smoke-5x5/base_model \
        --target up --steps 12

Each step samples 8 first replies for each of 4 maze prompts with the engine's own sampling,
rewards a reply 1 when its action is ``--target`` (0 otherwise), and applies one update with the
trainer's own ``grpo_update`` (SkyRL's loss reduction and policy loss, clipping, step) on
SkyRL's GRPO advantages, LoRA from the shipped config, AdamW at ``--lr``. It prints the action
counts and the rewarded fraction per step. The reward needs no perception, so this isolates the
update path from what the maze task asks of the model's vision.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np
import torch

from maze_engine.config import load_config
from maze_engine.grpo import compute_advantages
from maze_engine.trainer import grpo_update
from maze_engine.workers import lora_config_from_skyrl
from maze_env import generate
from maze_env.actions import Action, parse_action
from maze_env.prompts import Message, initial_messages
from maze_env.render import Renderer, token_aligned_style
from maze_policy.lora import load_policy
from maze_policy.policy import policy_logprobs
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed


def action_word(text: str) -> str:
    """The action a reply names, as the env parses it, or ``invalid``."""
    parsed = parse_action(text)
    return parsed.word if isinstance(parsed, Action) else "invalid"


def main() -> None:
    """Run the bandit and print the action counts per step."""
    p = argparse.ArgumentParser(description="GRPO on a one-turn bandit: is the update path sound?")
    p.add_argument("model", type=Path, help="a model directory (e.g. a warm-started base_model)")
    p.add_argument("--target", default="up", choices=["up", "down", "left", "right", "stop"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    cfg = load_config("smoke_5x5", []).skyrl
    algo = cfg.trainer.algorithm
    torch.manual_seed(args.seed)
    policy = load_policy(args.model, lora_config_from_skyrl(cfg.trainer.policy.model.lora), 1)
    params = [q for q in policy.model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    max_grad_norm = float(cfg.trainer.policy.optimizer_config.max_grad_norm)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    prompts: list[list[Message]] = []
    for seed in range(4):
        maze = generate("5x5", seed)
        prompts.append(initial_messages(maze, 7, renderer=Renderer(maze, token_aligned_style())))
    tok = policy.processor.tokenizer
    for step in range(args.steps):
        trajs = [policy.encoder.start(m) for m in prompts for _ in range(8)]
        gens = policy.generate(trajs, sampling, seed=derive_seed(args.seed, step))
        words: list[str] = []
        for traj, gen in zip(trajs, gens, strict=True):
            policy.encoder.add_assistant(traj, gen.token_ids, gen.logprobs)
            words.append(action_word(str(tok.decode(gen.token_ids, skip_special_tokens=True))))
        rewards = torch.tensor([float(w == args.target) for w in words])
        batch = policy.collate(trajs)
        adv = compute_advantages(rewards, batch.loss_mask, np.repeat(np.arange(4), 8), algo)
        policy.model.train()
        with torch.no_grad():
            old = policy_logprobs(policy, batch, sampling)
        grpo_update(
            policy,
            opt,
            batch,
            advantages=adv,
            old_logprobs=old,
            algo=algo,
            sampling=sampling,
            max_grad_norm=max_grad_norm,
        )
        policy.model.eval()
        counts = dict(collections.Counter(words).most_common())
        print(f"step {step:>2}: {args.target!r} in {rewards.mean():.0%} of 32 replies  {counts}")


if __name__ == "__main__":
    main()
