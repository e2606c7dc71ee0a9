"""Pure math: shapes, constraints, formulas, FLOPs, memory. Never imports torch.distributed."""
