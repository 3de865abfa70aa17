"""Hydra's per-job composition, done once per override list and extended for value overrides.

A sweep composes the same study many times: planning composes the baseline, then every variant (a knob list
or an ablation block), a bisection every probe, and the launcher every job again with its plan file added
(`sweep.plan=...`). Each is a full composition (defaults list, every YAML file parsed, the schema merged):
~0.1 s apiece here, and about half the CPU of the suite's synthetic sweeps (cProfile over their CLI runs).
Here `load_sweep_config` keeps each result, and composes `[*prefix, key=value]` from `prefix`'s result when the
last override only sets a value: Hydra's own `_apply_overrides_to_config` on a copy, its task-override list and
`override_dirname` brought up to date as its `_load_configuration_impl` does. Anything else (a config group,
+/~, a sweep, a hydra override) and the first override list of a chain are composed by Hydra in full, so every
result is the config Hydra composes for those overrides (tests/config/test_compose.py compares them). Written against
hydra-core 1.3.8 (pinned); without the two internals it uses, every composition is a full one.
"""

from __future__ import annotations

import copy
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

try:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname

    _apply = ConfigLoaderImpl._apply_overrides_to_config
except (ImportError, AttributeError):  # another Hydra: compose everything in full
    _apply = None


class ComposeOnce:
    """Hydra's config loader, with `load_sweep_config` memoised; everything else goes to the loader itself."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.parser = OverridesParser.create()
        self.composed: dict[tuple[int, tuple[str, ...]], DictConfig] = {}
        self.full = 0  # compositions Hydra made in full (the rest extended one of them)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "loader":  # pickling, before __init__ ran
            raise AttributeError(name)
        return getattr(self.loader, name)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        return copy.deepcopy(self._composed(master_config, tuple(sweep_overrides)))

    def _composed(self, master: DictConfig, overrides: tuple[str, ...]) -> DictConfig:
        key = (id(master), overrides)
        if key not in self.composed:
            if overrides and (override := self._value_override(overrides[-1])) is not None:
                cfg = self._extend(copy.deepcopy(self._composed(master, overrides[:-1])), override)
            else:
                cfg = self.loader.load_sweep_config(master, list(overrides))
                self.full += 1
            OmegaConf.copy_cache(from_config=master, to_config=cfg)
            self.composed[key] = cfg
        return self.composed[key]

    def _value_override(self, line: str) -> Override | None:
        """The parsed override when it only sets or force-adds a value (never a group, a sweep or a deletion)."""
        if _apply is None:
            return None
        try:
            (override,) = self.parser.parse_overrides([line])
        except Exception:  # an override Hydra refuses: its full composition says why
            return None
        plain = override.type in (OverrideType.CHANGE, OverrideType.FORCE_ADD)
        if (not plain or override.package is not None or override.is_sweep_override() or override.is_hydra_override()
                or self.loader.repository.group_exists(override.key_or_group)):
            return None
        return override

    def _extend(self, cfg: DictConfig, override: Override) -> DictConfig:
        """cfg with one value override applied as Hydra's _load_configuration_impl applies it."""
        try:
            _apply([override], cfg)
        except OmegaConfBaseException as exc:  # as ConfigLoaderImpl.load_configuration raises it
            raise ConfigCompositionException().with_traceback(exc.__traceback__) from exc
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task.append(override.input_line)
            task = self.parser.parse_overrides(list(cfg.hydra.overrides.task))
            dirname = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = get_overrides_dirname(overrides=task, kv_sep=dirname.kv_sep,
                                                                   item_sep=dirname.item_sep,
                                                                   exclude_keys=dirname.exclude_keys)
        return cfg
