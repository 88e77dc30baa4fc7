"""Consolidate FSDP2 / DCP sharded LoRA checkpoints into one PEFT adapter.

Streams the shards with bounded memory; optionally merges the adapter into base weights or
reshards the checkpoint for another world size.
"""

from importlib.metadata import version as _version

from lora_consolidate.consolidate import ConsolidateResult, consolidate
from lora_consolidate.errors import ConsolidationError, OutputExistsError, ShardError
from lora_consolidate.merge import MergeResult, merge_adapter
from lora_consolidate.reshard import ReshardResult, reshard
from lora_consolidate.sources import (
    DcpCheckpoint,
    RankFileCheckpoint,
    ShardedCheckpoint,
    open_checkpoint,
)

__version__ = _version("lora-consolidate")  # one source: the pyproject's version

__all__ = [
    "ConsolidateResult",
    "ConsolidationError",
    "DcpCheckpoint",
    "MergeResult",
    "OutputExistsError",
    "RankFileCheckpoint",
    "ReshardResult",
    "ShardError",
    "ShardedCheckpoint",
    "__version__",
    "consolidate",
    "merge_adapter",
    "open_checkpoint",
    "reshard",
]
