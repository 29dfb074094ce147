"""A drafter's vocabulary table learned as a projection of the target's: E_draft = E_target · P.

A small drafter with its own tied embedding / LM head spends most of its
bytes, and much of its training data, on a [V, d] table (49,152 rows for
SmolLM2). Borrowing the target's table through a learned P [H_target, d]
keeps the target's token geometry, trains d·H_target numbers instead of
V·d, and lets the checkpoint ship P alone (`checkpoints.strip_table`;
`checkpoints.materialize` rebuilds the table on the user's machine).
"""

from __future__ import annotations

import torch


def principal_directions(embedding: torch.Tensor, width: int) -> torch.Tensor:
    """[H, width]: the top right singular vectors of the (centred) table [V, H], the most it keeps in `width` columns."""
    centred = embedding.float() - embedding.float().mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)  # vh [H, H]
    return vh[:width].T.contiguous()


class ProjectedTable(torch.nn.Module):
    """table() = E_target · P: E frozen [V, H], P learned [H, d]."""

    def __init__(self, target_embedding: torch.Tensor, proj: torch.Tensor):
        super().__init__()
        self.register_buffer("target_embedding", target_embedding.detach().float(), persistent=False)  # [V, H]
        self.proj = torch.nn.Parameter(proj.detach().float().clone())  # P [H, d]

    def forward(self) -> torch.Tensor:
        return self.target_embedding @ self.proj  # [V, d]

    @classmethod
    def fit(cls, target_embedding: torch.Tensor, table: torch.Tensor) -> "ProjectedTable":
        """The P whose E·P is closest (least squares) to an existing table [V, d]: to convert a drafter trained with its own."""
        proj = torch.linalg.lstsq(target_embedding.float(), table.float()).solution  # [H, d]
        return cls(target_embedding, proj)
