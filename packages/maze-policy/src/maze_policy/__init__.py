"""The policy side of a maze VLM: loading, chat encoding, sampling, rollouts and LoRA.

What serving, evaluation and training share, without an RL framework: no SkyRL, no Ray. This
module exports only the torch-free names; import the rest by module path
(``from maze_policy.policy import Policy``), so light callers never import torch.

Modules: ``model`` (build a tiny Qwen3-VL, load any Qwen-VL checkpoint), ``chat`` (multi-turn
encoding with loss masks), ``policy`` (sampling and log-probs), ``rollout`` (episodes through
the skyrl-gym ``maze`` env), ``lora`` (the LoRA config builder), ``sampling``, ``seeds``,
``errors``.
"""

from importlib.metadata import version as _version

from maze_policy.errors import (
    AdapterMismatchError,
    ChatEncodingError,
    ContextRecordError,
    MazePolicyError,
    ModelLoadError,
    TokenizerError,
)
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed

__version__ = _version("maze-policy")  # one source: the pyproject's version

__all__ = [
    "AdapterMismatchError",
    "ChatEncodingError",
    "ContextRecordError",
    "MazePolicyError",
    "ModelLoadError",
    "SamplingParams",
    "TokenizerError",
    "__version__",
    "derive_seed",
]
