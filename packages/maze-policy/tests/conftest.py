"""Shared fixtures: one tiny Qwen3-VL built per session (see maze_policy.testing)."""

from maze_policy.testing import one_torch_thread, tiny_policy, tiny_vlm_dir

__all__ = ["one_torch_thread", "tiny_policy", "tiny_vlm_dir"]
