"""oneknob's command line: one job per run, a sweep with -m.

    python run.py                                  # the baseline, once
    python run.py -m cudagraph.capture=256,512     # vary one knob: the baseline, then the variants
    python run.py -m experiment=mtp_prompt_logprobs   # a study's ablation block, one knob at a time
"""

import hydra

import oneknob.config.schema  # noqa: F401  (registers the structured config)
from oneknob import cli


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    return cli.task(cfg)


if __name__ == "__main__":
    cli.main(main)
