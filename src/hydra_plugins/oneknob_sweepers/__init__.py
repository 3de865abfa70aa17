"""oneknob's Hydra sweepers (hydra/sweeper=oneknob, the default, and hydra/sweeper=ablation)."""
