"""oneknob's command line: one job per run, a sweep with -m.

    python run.py                                  # the baseline, once
    python run.py -m cudagraph.capture=256,512     # vary one knob
    python run.py -m experiment=mtp_prompt_logprobs hydra/sweeper=ablation
"""

import hydra

import oneknob.config  # noqa: F401  (registers the structured config)
from oneknob.app import main_task


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    return main_task(cfg)


if __name__ == "__main__":
    main()
